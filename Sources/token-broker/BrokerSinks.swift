import Dispatch
import TokenBrokerCore
import TokenBrokerSinks

/// Token files (`sinks`): the steps `Broker.run` and `Broker.stop` take for them.
///
/// In `run`: `sinkDirectoryProblem` after the configuration is read (a problem exits 2,
/// "invalid configuration"); `startSinks` once the providers run, with each sink's provider
/// (for a template, the child held for the sink's values). In `stop`: `stopSinks` before the
/// providers shut down, so that a write under way ends with the token it began with.
extension Broker {
    /// A sink and the provider it writes from.
    struct SinkTarget {
        let sink: SinkConfiguration
        let provider: Provider
        /// What keeps `provider` alive while the sink runs (a template's child held for the
        /// sink); let go of at stop. Nil for a configured provider.
        let retained: (any Sendable)?

        init(sink: SinkConfiguration, provider: Provider, retained: (any Sendable)? = nil) {
            self.sink = sink
            self.provider = provider
            self.retained = retained
        }
    }

    /// The sinks' runners, each in a task of its own.
    struct RunningSinks {
        let runners: [SinkRunner<ContinuousClock>]
        let tasks: [Task<Void, Never>]
        let retained: [(any Sendable)?]

        /// Each sink's state, for `/readyz` and the metrics, in configuration order.
        func statuses() -> [SinkStatus] { runners.map { $0.status() } }
    }

    /// The first sink whose directory cannot hold its file, and why, as `sinks[0].path: …`; nil when all can.
    static func sinkDirectoryProblem(_ configuration: BrokerConfiguration) -> String? {
        for (index, sink) in configuration.sinks.enumerated() {
            if let problem = SinkDirectory.problem(for: sink.path) { return "sinks[\(index)].path: \(problem)" }
        }
        return nil
    }

    /// The sinks on configured providers, found by name, in configuration order; sinks on
    /// templates are left to the caller, who holds the child for each.
    static func sinkTargets(_ configuration: BrokerConfiguration, providers: [Provider]) -> [SinkTarget] {
        configuration.sinks.compactMap { sink in
            guard let provider = providers.first(where: { $0.name == sink.provider }),
                !provider.configuration.isTemplate
            else { return nil }
            return SinkTarget(sink: sink, provider: provider)
        }
    }

    /// Starts one runner per sink, each logging its writes (with the token's fingerprint, never
    /// the token) and reporting each to `recordWrite` (the provider's configured name, and
    /// whether the write succeeded), such as `BrokerMetrics.recordSinkWrite(provider:succeeded:)`.
    static func startSinks(
        _ targets: [SinkTarget], recordWrite: @escaping @Sendable (_ provider: String, _ succeeded: Bool) -> Void
    ) -> RunningSinks {
        let events = SinkEvents { write in
            recordWrite(write.sink.provider, write.error == nil)
            logSinkWrite(write)
        }
        let runners = targets.map { SinkRunner(configuration: $0.sink, provider: $0.provider, events: events) }
        let tasks = runners.map { runner in
            Task.detached {
                await runner.run()
                // Not stopped by `stopSinks`: its provider shut down (a template's child dropped, say).
                if !Task.isCancelled {
                    Log.warning(
                        "token file sink stopped: its provider shut down; the file keeps its last token",
                        ["provider": runner.configuration.provider, "path": runner.configuration.path])
                }
            }
        }
        for target in targets {
            Log.info(
                "token file sink started",
                [
                    "provider": target.sink.provider, "path": target.sink.path, "format": target.sink.format.rawValue,
                    "mode": "0" + String(target.sink.mode, radix: 8), "values": sinkValues(target.sink),
                ])
        }
        return RunningSinks(runners: runners, tasks: tasks, retained: targets.map(\.retained))
    }

    /// Stops every runner and waits, at most `limit`, for a write under way to end.
    ///
    /// - Important: blocks the calling thread: call it from the main thread, never from Swift's pool.
    static func stopSinks(_ running: RunningSinks, atMost limit: Duration = .seconds(2)) {
        for task in running.tasks { task.cancel() }
        let ended = DispatchSemaphore(value: 0)
        let tasks = running.tasks
        Task.detached {
            for task in tasks { await task.value }
            ended.signal()
        }
        if ended.wait(timeout: .now() + .milliseconds(Int(clamping: limit.wholeMilliseconds))) == .timedOut {
            Log.warning(
                "a token file write was still under way at stop", ["waited_ms": String(limit.wholeMilliseconds)])
        }
    }

    /// One log line per write: the file, the version and the token's fingerprint; a failure with its reason.
    private static func logSinkWrite(_ write: SinkEvents.Write) {
        let sink = write.sink
        if let error = write.error {
            Log.error(
                "token file not written; the file keeps its previous token, and the write is tried again",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint, "problem": error.description,
                ])
        } else {
            Log.info(
                write.isRetry ? "token file written after a failed write" : "token file written",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint,
                ])
        }
    }

    /// The child's values a sink names, for its log line: `defaults` when none.
    private static func sinkValues(_ sink: SinkConfiguration) -> String {
        TokenRequestValues(
            audience: sink.audience, scopes: sink.scope.map { $0.split(separator: " ").map(String.init) },
            resource: sink.resource
        ).description
    }
}
