import TokenBrokerCore
import TokenBrokerServer

/// The error answers every route shares, in the `{"error", "error_description"}` shape.
public enum Responses {
    static func notFound(_ path: String) -> HTTPResponse {
        .error(404, "not_found", "no route for \(String(path.prefix(200)))")
    }

    static func methodNotAllowed(_ method: String, allow: [String]) -> HTTPResponse {
        .error(
            405, "method_not_allowed", "\(String(method.prefix(32))) is not allowed here; allowed: \(allow.joined(separator: ", "))",
            headers: [("Allow", allow.joined(separator: ", "))])
    }

    /// The answer to requests still waiting when the broker stops.
    public static let shuttingDown = HTTPResponse.error(503, "shutting_down", "the broker is stopping", headers: [("Retry-After", "1")])

    /// A new request while the broker stops; the connection closes after it.
    static let refusedWhileStopping = HTTPResponse.error(
        503, "shutting_down", "the broker is stopping", headers: [("Retry-After", "1"), ("Connection", "close")])

    /// The server's own refusals, worded for both listeners.
    static func refusal(_ reason: ServerRefusal) -> HTTPResponse {
        switch reason {
        case .malformedHead(let problem): .error(400, "invalid_request", problem, headers: [("Connection", "close")])
        case .stopping: refusedWhileStopping
        case .stopped: shuttingDown
        }
    }

    /// A request target in absolute form (`GET http://host/path`): the broker is not a forward proxy.
    static let absoluteForm = HTTPResponse.error(
        400, "invalid_request", "request targets must be paths (origin form); absolute URLs are refused")
}

extension HTTPResponse {
    /// The JSON error answer every route uses: `{"error": "...", "error_description": "..."}`.
    public static func error(_ status: Int, _ error: String, _ description: String, headers: [(String, String)] = []) -> HTTPResponse {
        HTTPResponse(status: status, json: JSONText.errorBody(error, description), headers: headers)
    }
}
