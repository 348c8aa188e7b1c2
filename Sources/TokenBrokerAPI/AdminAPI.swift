import TokenBrokerCore
import TokenBrokerServer

/// The admin listener's routes, on their own address so that they can be exposed to an
/// orchestrator without exposing tokens.
///
/// | route | answer |
/// |---|---|
/// | `GET /healthz` | 200 while the process runs |
/// | `GET /readyz` | 200 when every provider has a valid token, or is paused and still holds one, and every held template child is ready, and the broker is not stopping; else 503 |
/// | `GET /metrics` | Prometheus text format 0.0.4 |
/// | `POST /reload` | reads the configuration file again, as SIGHUP does; answers once the reload has ended (`ReloadOutcome`). Needs `Token-Broker-Request: true` |
///
/// Templates (`perRequest`) are listed in `/readyz` with their children's count and how many
/// are ready. Children made by requests come and go with their callers, so they do not make the
/// broker unready; children held by token files do (`TemplateStatus.held`). Token files are
/// listed too, and one that holds no valid token makes the broker unready.
public final class AdminAPI: HTTPHandler {
    /// What `/readyz` says of the token store: its kind, and why it does not answer (a Redis
    /// store out of reach), which does not make the broker unready: it then fetches alone.
    public struct StoreReport: Sendable {
        public let type: String
        public let problem: String?

        public init(type: String, problem: String?) {
            self.type = type
            self.problem = problem
        }
    }

    /// What `/readyz` says of one token file (a sink).
    public struct TokenFileReport: Sendable, Equatable {
        /// The provider's configured name (a template's, for a child).
        public var provider: String
        /// The file.
        public var path: String
        /// The version the file holds, once written.
        public var version: UInt64?
        /// The file holds a token that is still valid.
        public var ready: Bool
        /// Why the last write failed, while no write has succeeded since.
        public var lastError: String?
        /// Why readers of the path do not see the writes (the directory was replaced since start).
        public var problem: String?

        public init(
            provider: String, path: String, version: UInt64?, ready: Bool, lastError: String?, problem: String? = nil
        ) {
            self.provider = provider
            self.path = path
            self.version = version
            self.ready = ready
            self.lastError = lastError
            self.problem = problem
        }
    }

    private let providers: [any TokenProviding]
    private let templates: [any TemplateStatusReporting]
    private let tokenFiles: @Sendable () -> [TokenFileReport]
    private let store: @Sendable () -> StoreReport?
    private let metrics: BrokerMetrics
    /// Starts a reload, and calls back once with how it ended; nil where none can be made.
    public typealias Reload = @Sendable (_ ended: @escaping @Sendable (ReloadOutcome) -> Void) -> Void
    private let reload: Reload?
    /// Whether the broker is stopping: `/readyz` then says not ready, whatever the providers hold,
    /// since the token listener takes no new connection.
    private let stopping: @Sendable () -> Bool
    private let healthy = HTTPResponse(status: 200, json: #"{"status":"ok"}"#)

    /// - Parameters:
    ///   - providers: the ordinary providers.
    ///   - templates: the provider templates.
    ///   - tokenFiles: the token files' state now, read at each `/readyz`.
    ///   - store: the token store's state now, read at each `/readyz`; nil without a store.
    ///   - reload: what `POST /reload` asks for; without it the route answers 404.
    ///   - stopping: whether the broker has begun to stop, read at each `/readyz`.
    public init(
        providers: [any TokenProviding], templates: [any TemplateStatusReporting] = [],
        tokenFiles: @escaping @Sendable () -> [TokenFileReport] = { [] },
        store: @escaping @Sendable () -> StoreReport? = { nil }, metrics: BrokerMetrics, reload: Reload? = nil,
        stopping: @escaping @Sendable () -> Bool = { false }
    ) {
        self.reload = reload
        self.stopping = stopping
        self.providers = providers
        self.templates = templates
        self.tokenFiles = tokenFiles
        self.store = store
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
        case "/reload" where reload != nil:
            route = "/reload"
            reply = Methods.only(Methods.post, request) ?? startReload(request)
        default:
            route = "other"
            reply = .response(ErrorAnswer.notFound(path: request.path).response)
        }
        if case .response(let response) = reply {
            metrics.recordRequest(listener: "admin", route: route, status: response.status)
        }
        return reply
    }

    /// Behind the request guard, as a browser's cross-site POST cannot be; the answer is the reload's outcome.
    private func startReload(_ request: HTTPRequest) -> HTTPReply {
        if let refused = RequestGuard.check(request) { return .response(refused.response) }
        guard let reload else { return .response(ErrorAnswer.notFound(path: request.path).response) }
        let metrics = metrics
        return .deferred { responder in
            reload { outcome in
                let response = outcome.response
                metrics.recordRequest(listener: "admin", route: "/reload", status: response.status)
                responder.respond(response)
            }
        }
    }

    private func exposition() -> HTTPResponse {
        HTTPResponse(
            status: 200,
            body: Array(
                metrics.render(statuses: providers.map { $0.status() }, templates: templates.map { $0.status() }).utf8),
            headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"), ("Cache-Control", "no-store")])
    }

    /// Ready when every provider can answer `/token` now (`ProviderStatus.isReady`), and every
    /// child a token file holds can, and the broker is not stopping. Secrets, and the values
    /// children were made for, never appear here.
    private func readiness() -> HTTPResponse {
        let statuses = providers.map { $0.status() }
        let templateStatuses = templates.map { $0.status() }
        let files = tokenFiles()
        let isStopping = stopping()
        let ready =
            !isStopping && statuses.allSatisfy(\.isReady) && templateStatuses.allSatisfy(\.heldReady)
            && files.allSatisfy(\.ready)
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
        let fileDetail = files.map { file in
            var members: [(String, String)] = [
                ("provider", JSONText.quoted(file.provider)), ("path", JSONText.quoted(file.path)),
                ("ready", file.ready ? "true" : "false"),
            ]
            if let version = file.version { members.append(("version", String(version))) }
            if let error = file.lastError { members.append(("last_error", JSONText.quoted(error))) }
            if let problem = file.problem { members.append(("problem", JSONText.quoted(problem))) }
            return JSONText.object(members)
        }
        var members = [
            ("ready", ready ? "true" : "false"), ("stopping", isStopping ? "true" : "false"),
            ("providers", "[" + detail.joined(separator: ",") + "]"),
            ("templates", "[" + templateDetail.joined(separator: ",") + "]"),
            ("sinks", "[" + fileDetail.joined(separator: ",") + "]"),
        ]
        if let store = store() {
            var report = [("type", JSONText.quoted(store.type)), ("degraded", store.problem == nil ? "false" : "true")]
            if let problem = store.problem { report.append(("problem", JSONText.quoted(problem))) }
            members.append(("store", JSONText.object(report)))
        }
        let body = JSONText.object(members)
        return HTTPResponse(status: ready ? 200 : 503, json: body)
    }
}
