import TokenBrokerCore
import TokenBrokerServer

/// The admin listener's routes, on their own address so that they can be exposed to an
/// orchestrator without exposing tokens.
///
/// | route | answer |
/// |---|---|
/// | `GET /healthz` | 200 while the process runs |
/// | `GET /readyz` | 200 when every provider has a valid token, or is paused and still holds one, and every held template child is ready; else 503 |
/// | `GET /metrics` | Prometheus text format 0.0.4 |
///
/// Templates (`perRequest`) are listed in `/readyz` with their children's count and how many
/// are ready. Children made by requests come and go with their callers, so they do not make the
/// broker unready; children held by token files do (`TemplateStatus.held`).
public final class AdminAPI: HTTPHandler {
    private let providers: [any TokenProviding]
    private let templates: [any TemplateStatusReporting]
    private let metrics: BrokerMetrics
    private let healthy = HTTPResponse(status: 200, json: #"{"status":"ok"}"#)

    /// - Parameters:
    ///   - providers: the ordinary providers.
    ///   - templates: the provider templates.
    public init(
        providers: [any TokenProviding], templates: [any TemplateStatusReporting] = [], metrics: BrokerMetrics
    ) {
        self.providers = providers
        self.templates = templates
        self.metrics = metrics
    }

    public func refusal(_ reason: ServerRefusal) -> HTTPResponse { ErrorAnswer.refusal(reason).response }

    public func handle(_ request: HTTPRequest) -> HTTPReply {
        let route: String
        let reply: HTTPReply
        switch request.path {
        case "/healthz":
            route = "/healthz"
            reply = Methods.only(Methods.read, request) ?? .response(healthy)
        case "/readyz":
            route = "/readyz"
            reply = Methods.only(Methods.read, request) ?? .response(readiness())
        case "/metrics":
            route = "/metrics"
            reply = Methods.only(Methods.read, request) ?? .response(exposition())
        default:
            route = "other"
            reply = .response(ErrorAnswer.notFound(path: request.path).response)
        }
        if case .response(let response) = reply {
            metrics.recordRequest(listener: "admin", route: route, status: response.status)
        }
        return reply
    }

    private func exposition() -> HTTPResponse {
        HTTPResponse(
            status: 200,
            body: Array(
                metrics.render(statuses: providers.map { $0.status() }, templates: templates.map { $0.status() }).utf8),
            headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"), ("Cache-Control", "no-store")])
    }

    /// Ready when every provider can answer `/token` now (`ProviderStatus.isReady`), and every
    /// child a token file holds can. Secrets, and the values children were made for, never appear here.
    private func readiness() -> HTTPResponse {
        let statuses = providers.map { $0.status() }
        let templateStatuses = templates.map { $0.status() }
        // Token files (sinks) will add their own condition here.
        let ready = statuses.allSatisfy(\.isReady) && templateStatuses.allSatisfy(\.heldReady)
        let detail = statuses.map { status in
            var members: [(String, String)] = [
                ("name", JSONText.quoted(status.name)), ("ready", status.isReady ? "true" : "false"),
                ("state", JSONText.quoted(status.phase.rawValue)), ("stale", status.stale ? "true" : "false"),
            ]
            if let version = status.version { members.append(("version", String(version))) }
            if let left = status.expiresIn { members.append(("expires_in", String(left.secondsLeft))) }
            if let error = status.lastError {
                members.append(("last_error", JSONText.quoted(error.description)))
                members.append(("last_error_description", JSONText.quoted(error.summary)))
            }
            return JSONText.object(members)
        }
        let templateDetail = templateStatuses.map { status in
            JSONText.object([
                ("name", JSONText.quoted(status.name)), ("children", String(status.children)),
                ("ready", String(status.ready)), ("max_children", String(status.maxChildren)),
            ])
        }
        let body = JSONText.object([
            ("ready", ready ? "true" : "false"), ("providers", "[" + detail.joined(separator: ",") + "]"),
            ("templates", "[" + templateDetail.joined(separator: ",") + "]"),
        ])
        return HTTPResponse(status: ready ? 200 : 503, json: body)
    }
}
