import TokenBrokerCore
import TokenBrokerServer

/// How a configuration reload ended (SIGHUP, `POST /reload`, `token-broker reload`), as the
/// log, the metrics (`token_broker_reloads_total{result}`) and `POST /reload`'s answer say it.
public enum ReloadOutcome: Sendable, Equatable {
    /// The new configuration runs; the providers, by name, as they fared.
    case reloaded(ReloadSummary)
    /// The file cannot be read or is not a valid configuration: `problem` as `--check-config` says it.
    case invalid(problem: String)
    /// The file changes something that only a restart can change (a listener's address, …).
    case refused(problem: String)
    /// A new provider (a replacement or an added one), or a token file, got no token in time;
    /// the old configuration still runs. Or the broker began to stop (`stopping`).
    case abandoned(problem: String)

    /// A reload under way when the broker began to stop, or asked for since: none is made.
    public static let stopping = ReloadOutcome.abandoned(problem: "the broker is stopping")

    /// The `result` label: one of `BrokerMetrics.reloadResults`.
    public var result: String {
        switch self {
        case .reloaded: "reloaded"
        case .invalid: "invalid"
        case .refused: "refused"
        case .abandoned: "abandoned"
        }
    }

    /// Why the reload did not take, or nil when it did.
    public var problem: String? {
        switch self {
        case .reloaded: nil
        case .invalid(let problem), .refused(let problem), .abandoned(let problem): problem
        }
    }

    /// `POST /reload`'s answer: 200 with the providers by fate; else the error answer.
    public var response: HTTPResponse {
        switch self {
        case .reloaded(let summary):
            func names(_ list: [String]) -> String { "[" + list.map(JSONText.quoted).joined(separator: ",") + "]" }
            return HTTPResponse(
                status: 200,
                json: JSONText.object([
                    ("reloaded", "true"), ("added", names(summary.added)), ("changed", names(summary.changed)),
                    ("removed", names(summary.removed)), ("unchanged", names(summary.unchanged)),
                ]))
        case .invalid(let problem): return ErrorAnswer.reloadInvalid(problem: problem).response
        case .refused(let problem): return ErrorAnswer.reloadRefused(problem: problem).response
        case .abandoned(let problem): return ErrorAnswer.reloadAbandoned(problem: problem).response
        }
    }
}

/// The providers of a reload that took, by name, each list in configuration order (the removed
/// ones in the old configuration's).
public struct ReloadSummary: Sendable, Equatable {
    public var added: [String] = []
    public var changed: [String] = []
    public var removed: [String] = []
    public var unchanged: [String] = []

    public init() {}
}
