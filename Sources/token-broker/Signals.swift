import Glibc

/// SIGTERM and SIGINT: blocked in every thread, then taken synchronously by the main thread.
enum Signals {
    private static var stopSignals: sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        return set
    }

    /// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later, and
    /// ignores SIGPIPE (a client that hangs up must not kill the broker).
    static func blockStopSignals() {
        var set = stopSignals
        pthread_sigmask(SIG_BLOCK, &set, nil)
        signal(SIGPIPE, SIG_IGN)
    }

    /// Waits for SIGTERM or SIGINT and returns its name.
    static func waitForStop() -> String {
        var set = stopSignals
        var received: Int32 = 0
        while sigwait(&set, &received) != 0 {}
        return received == SIGTERM ? "SIGTERM" : "SIGINT"
    }
}
