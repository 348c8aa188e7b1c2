import Dispatch
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerSinks

/// Token files (`sinks`): the steps `Broker.run` and `Broker.stop` take for them.
///
/// In `run`: `sinkDirectoryProblem` after the configuration is read (a problem exits 2,
/// "invalid configuration"); `makeSinks` once the providers are made, with each sink's provider
/// (for a template, the child held for the sink's values), and `startSinks` once they run. In
/// `stop`: `stopSinks` before the providers shut down, so that a write under way ends with the
/// token it began with.
extension Broker {
    /// A sink and the provider it writes from.
    struct SinkTarget {
        let sink: SinkConfiguration
        let provider: Provider
        /// For a template's child: the template and the values it holds the child for, released at stop.
        var held: (template: Template, values: TokenRequestValues)? = nil
    }

    /// The sinks' runners, made before the listeners open so that `/readyz` can report them.
    struct Sinks: Sendable {
        let runners: [SinkRunner<ContinuousClock>]
        let held: [(template: Template, values: TokenRequestValues)]

        /// Each token file's state, as `/readyz` reports it, in configuration order.
        func reports() -> [AdminAPI.TokenFileReport] {
            runners.map { runner in
                let status = runner.status()
                return AdminAPI.TokenFileReport(
                    provider: status.provider, path: status.path, version: status.version,
                    ready: status.holdsValidToken, lastError: status.lastError?.description)
            }
        }
    }

    /// The sinks' runners, each in a task of its own.
    struct RunningSinks {
        let sinks: Sinks
        let tasks: [Task<Void, Never>]
    }

    /// The first sink whose directory cannot hold its file, and why, as `sinks[0].path: …`; nil when all can.
    static func sinkDirectoryProblem(_ configuration: BrokerConfiguration) -> String? {
        for (index, sink) in configuration.sinks.enumerated() {
            if let problem = SinkDirectory.problem(for: sink.path) { return "sinks[\(index)].path: \(problem)" }
        }
        return nil
    }

    /// One runner per sink, in configuration order, each on its provider: a configured provider
    /// found by name, or, for a template, the child held for the sink's values (kept alive, never
    /// dropped for idleness, until `stopSinks`). Fails when a template cannot hold one more child.
    static func makeSinks(
        _ configuration: BrokerConfiguration, providers: Providers,
        events recordWrite: @escaping @Sendable (_ provider: String, _ succeeded: Bool) -> Void
    ) throws(ConfigurationError) -> Sinks {
        var targets: [SinkTarget] = []
        for (index, sink) in configuration.sinks.enumerated() {
            if let provider = providers.providers.first(where: { $0.name == sink.provider }) {
                targets.append(SinkTarget(sink: sink, provider: provider))
                continue
            }
            guard let template = providers.templates.first(where: { $0.name == sink.provider }) else {
                throw ConfigurationError(key: "sinks[\(index)].provider", "no provider is named \"\(sink.provider)\"")
            }
            // The configuration checked the values against the template's allow-lists.
            let values: TokenRequestValues
            switch sink.requestValues(for: template.configuration) {
            case .success(let checked): values = checked
            case .failure(let problem):
                throw ConfigurationError(
                    key: "sinks[\(index)].\(problem.parameter.rawValue)", "is not a value the template allows")
            }
            switch template.hold(values) {
            case .success(let child):
                targets.append(SinkTarget(sink: sink, provider: child, held: (template, values)))
            case .failure:
                throw ConfigurationError(
                    key: "sinks[\(index)]",
                    "template \"\(template.name)\" cannot hold another child (maxChildren \(template.configuration.maxChildren))"
                )
            }
        }
        let events = SinkEvents { write in
            recordWrite(write.sink.provider, write.error == nil)
            logSinkWrite(write)
        }
        return Sinks(
            runners: targets.map { SinkRunner(configuration: $0.sink, provider: $0.provider, events: events) },
            held: targets.compactMap(\.held))
    }

    /// Starts each runner in a task of its own.
    static func startSinks(_ sinks: Sinks) -> RunningSinks {
        let tasks = sinks.runners.map { runner in
            Task.detached {
                await runner.run()
                // Not stopped by `stopSinks`: its provider shut down.
                if !Task.isCancelled {
                    Log.warning(
                        "token file sink stopped: its provider shut down; the file keeps its last token",
                        ["provider": runner.configuration.provider, "path": runner.configuration.path])
                }
            }
        }
        for runner in sinks.runners {
            let sink = runner.configuration
            Log.info(
                "token file sink started",
                [
                    "provider": sink.provider, "path": sink.path, "format": sink.format.rawValue,
                    "mode": "0" + String(sink.mode, radix: 8), "values": sinkValues(sink),
                ])
        }
        return RunningSinks(sinks: sinks, tasks: tasks)
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
        for (template, values) in running.sinks.held { template.release(values) }
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
