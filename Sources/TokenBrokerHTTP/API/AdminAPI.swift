import TokenBrokerCore

/// The admin listener's routes, on their own address so that they can be exposed to an
/// orchestrator without exposing tokens.
///
/// | route | answer |
/// |---|---|
/// | `GET /healthz` | 200 while the process runs |
/// | `GET /readyz` | 200 when every provider has a valid token, else 503, with detail per provider |
public final class AdminAPI: HTTPHandler {
    private let providers: [TokenAPI.Provider]
    private let healthy = HTTPResponse(status: 200, json: #"{"status":"ok"}"#)

    public init(providers: [TokenAPI.Provider]) { self.providers = providers }

    public func handle(_ request: HTTPRequest) -> HTTPReply {
        switch request.path {
        case "/healthz":
            return TokenAPI.only(["GET", "HEAD"], request) ?? .response(healthy)
        case "/readyz":
            return TokenAPI.only(["GET", "HEAD"], request) ?? .response(readiness())
        default:
            return .response(Responses.notFound(request.path))
        }
    }

    /// Ready when every provider can answer `/token` now. Secrets never appear here.
    private func readiness() -> HTTPResponse {
        let statuses = providers.map { $0.status() }
        let ready = statuses.allSatisfy(\.hasValidToken)
        let detail = statuses.map { status in
            var members: [(String, String)] = [
                ("name", JSONText.quoted(status.name)), ("ready", status.hasValidToken ? "true" : "false"),
                ("state", JSONText.quoted(status.phase)), ("stale", status.stale ? "true" : "false"),
            ]
            if let version = status.version { members.append(("version", String(version))) }
            if let left = status.expiresIn { members.append(("expires_in", String(left.components.seconds))) }
            if let error = status.lastError {
                members.append(("last_error", JSONText.quoted(error.description)))
                members.append(("last_error_description", JSONText.quoted(error.summary)))
            }
            return JSONText.object(members)
        }
        let body = JSONText.object([("ready", ready ? "true" : "false"), ("providers", "[" + detail.joined(separator: ",") + "]")])
        return HTTPResponse(status: ready ? 200 : 503, json: body)
    }
}
