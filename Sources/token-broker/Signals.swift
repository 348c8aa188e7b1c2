import Glibc

/// SIGTERM and SIGINT, and SIGHUP: blocked in every thread, then taken synchronously by the main
/// thread.
///
/// SIGHUP's default action would end the process; an operator who sends it expecting a reload
/// must not lose the broker. Reloading is not built yet, so SIGHUP is logged and ignored.
enum Signals {
    private static var stopSignals: sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGHUP)
        return set
    }

    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts later,
    /// and ignores SIGPIPE (a client that hangs up must not kill the broker).
    ///
    /// Without the mask a stop signal could land on any thread and end the process at once,
    /// with no drain; so a failure stops the broker before it starts.
    static func blockStopSignals() {
        var set = stopSignals
        let status = pthread_sigmask(SIG_BLOCK, &set, nil)
        guard status == 0 else {
            Log.error(
                "cannot start",
                ["problem": "cannot block SIGTERM, SIGINT and SIGHUP: \(String(cString: strerror(status)))"])
            exit(1)
        }
        signal(SIGPIPE, SIG_IGN)  // fails only for an invalid signal number
    }

    /// Waits for SIGTERM or SIGINT and returns its name; a SIGHUP meanwhile is logged and ignored.
    static func waitForStop() -> String {
        var set = stopSignals
        while true {
            var received: Int32 = 0
            while sigwait(&set, &received) != 0 {}
            guard received == SIGHUP else { return received == SIGTERM ? "SIGTERM" : "SIGINT" }
            Log.warning("SIGHUP ignored: reloading the configuration is not supported yet; restart to apply changes")
        }
    }
}
