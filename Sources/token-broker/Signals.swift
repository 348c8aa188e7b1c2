import Glibc

/// SIGTERM and SIGINT, which stop the broker, and SIGHUP, which reloads its configuration:
/// blocked in every thread, then taken synchronously by the main thread.
enum Signals {
    /// What the main thread is asked to do.
    enum Event: Equatable {
        /// Stop: SIGTERM or SIGINT, by name.
        case stop(String)
        /// Reload the configuration: SIGHUP (also what `POST /reload` raises).
        case reload
    }

    private static func set(_ signals: [Int32]) -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        return set
    }

    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts later,
    /// and ignores SIGPIPE (a client that hangs up must not kill the broker).
    ///
    /// Without the mask a stop signal could land on any thread and end the process at once,
    /// with no drain; and SIGHUP's default action would end it too. So a failure stops the
    /// broker before it starts.
    static func blockStopSignals() {
        var set = set([SIGTERM, SIGINT, SIGHUP])
        let status = pthread_sigmask(SIG_BLOCK, &set, nil)
        guard status == 0 else {
            Log.error(
                "cannot start",
                ["problem": "cannot block SIGTERM, SIGINT and SIGHUP: \(String(cString: strerror(status)))"])
            exit(1)
        }
        signal(SIGPIPE, SIG_IGN)  // fails only for an invalid signal number
    }

    /// Waits for SIGTERM, SIGINT or SIGHUP.
    static func next() -> Event {
        var set = set([SIGTERM, SIGINT, SIGHUP])
        var received: Int32 = 0
        while sigwait(&set, &received) != 0 {}
        return event(received)
    }

    /// Waits at most `limit` for SIGTERM or SIGINT, and returns its name; a SIGHUP stays pending.
    static func stopSignal(waitingAtMost limit: Duration) -> String? {
        var set = set([SIGTERM, SIGINT])
        let milliseconds = max(0, limit.wholeMilliseconds)
        var timeout = timespec(tv_sec: Int(milliseconds / 1000), tv_nsec: Int(milliseconds % 1000) * 1_000_000)
        let received = sigtimedwait(&set, nil, &timeout)
        guard received > 0, case .stop(let name) = event(received) else { return nil }
        return name
    }

    private static func event(_ signal: Int32) -> Event {
        switch signal {
        case SIGHUP: .reload
        case SIGTERM: .stop("SIGTERM")
        default: .stop("SIGINT")
        }
    }
}
