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
    ///
    /// Without the mask a stop signal could land on any thread and end the process at once,
    /// with no drain; so a failure stops the broker before it starts.
    static func blockStopSignals() {
        var set = stopSignals
        let status = pthread_sigmask(SIG_BLOCK, &set, nil)
        guard status == 0 else {
            Log.error(
                "cannot start", ["problem": "cannot block SIGTERM and SIGINT: \(String(cString: strerror(status)))"])
            exit(1)
        }
        signal(SIGPIPE, SIG_IGN)  // fails only for an invalid signal number
    }

    /// Waits for SIGTERM or SIGINT and returns its name.
    static func waitForStop() -> String {
        var set = stopSignals
        var received: Int32 = 0
        while sigwait(&set, &received) != 0 {}
        return received == SIGTERM ? "SIGTERM" : "SIGINT"
    }
}
