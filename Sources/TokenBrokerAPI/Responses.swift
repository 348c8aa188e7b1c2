import TokenBrokerCore
import TokenBrokerServer

/// The error answers every route shares, in the `{"error", "error_description"}` shape.
enum Responses {
    static func notFound(_ path: String) -> HTTPResponse {
        .error(404, "not_found", "no route for \(String(path.prefix(200)))")
    }

    static func methodNotAllowed(_ method: String, allow: [String]) -> HTTPResponse {
        .error(
            405, "method_not_allowed", "\(String(method.prefix(32))) is not allowed here; allowed: \(allow.joined(separator: ", "))",
            headers: [("Allow", allow.joined(separator: ", "))])
    }

    static var shuttingDown: HTTPResponse { HTTPServer.stopping }

    /// A request target in absolute form (`GET http://host/path`): the broker is not a forward proxy.
    static let absoluteForm = HTTPResponse.error(
        400, "invalid_request", "request targets must be paths (origin form); absolute URLs are refused")
}
