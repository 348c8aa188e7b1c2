import TokenBrokerCore
import TokenBrokerServer

/// The token listener's routes. Each token route exists for the default provider and, under
/// `/providers/{name}`, for every provider by name.
///
/// | route | answer |
/// |---|---|
/// | `GET /token` | the token (`TokenAPI+Token.swift`) |
/// | `GET /token/ready` | a long-poll for a token newer than `after` (`TokenAPI+LongPoll.swift`) |
/// | `POST /token/refresh` | the retrier: refresh a rejected token (`TokenAPI+Refresh.swift`) |
/// | `GET /.well-known/jwks.json` | the local signers' public keys |
/// | `ANY /proxy/{name}/{path}` | proxy mode: forwarded with a token (`ProxyRoute.swift`) |
///
/// Token routes pass the request guard first (`RequestGuard`), then, when callers have keys
/// (`clientKeysFile`), the caller check (`CallerCheck`). Error answers are worded in `ErrorAnswer`.
///
/// `Provider` is the broker's `TokenProvider` in service, and a provider of a test's making in unit tests.
public final class TokenAPI<Provider: TokenProviding>: HTTPHandler {

    /// One provider and what its routes keep.
    struct Endpoint: Sendable {
        let provider: Provider
        let responses: TokenResponseCache<Provider.Instant>
        /// Request counters of `/token`, `/token/ready` and `/token/refresh`, in `Route` order.
        let counters: [RequestCounter]

        init(
            provider: Provider, responses: TokenResponseCache<Provider.Instant>, routePrefix: String,
            metrics: BrokerMetrics
        ) {
            self.provider = provider
            self.responses = responses
            counters = Route.allCases.map { metrics.counter(listener: "token", route: routePrefix + $0.rawValue) }
        }

        func counter(_ route: Route) -> RequestCounter { counters[route.index] }
    }

    /// A token route, as the router found it.
    enum Route: String, CaseIterable {
        case token = "/token"
        case ready = "/token/ready"
        case refresh = "/token/refresh"

        var index: Int {
            switch self {
            case .token: 0
            case .ready: 1
            case .refresh: 2
            }
        }
    }

    let endpoints: [String: Endpoint]
    let defaultEndpoint: Endpoint
    let maxWait: Duration
    let metrics: BrokerMetrics
    private let guardRequests: Bool
    private let callers: (any CallerAuthorizing)?
    /// Proxy mode's routes, present only when proxies are configured (the server then streams
    /// requests under `/proxy/` to `begin`, with their raw target).
    let proxy: (any ProxyHandling)?
    let proxyCounter: RequestCounter
    private let jwks: HTTPResponse
    private let jwksCounter: RequestCounter
    private let unknownProviderCounter: RequestCounter
    private let otherCounter: RequestCounter

    /// - Parameters:
    ///   - providers: the providers; the first answers the routes without `/providers/{name}`.
    ///   - jwks: the JWK Set document to publish.
    ///   - maxWait: the longest a request waits (long-polls, on-demand fetches, refreshes).
    ///   - requestGuard: require `Token-Broker-Request: true` and refuse `X-Forwarded-For`.
    ///   - callers: who may read which provider; nil lets every client read every provider.
    ///   - proxy: proxy mode's routes, when proxies are configured.
    public init(
        providers: [Provider], jwks: String, maxWait: Duration, requestGuard: Bool = true,
        callers: (any CallerAuthorizing)? = nil, proxy: (any ProxyHandling)? = nil, metrics: BrokerMetrics
    ) {
        precondition(!providers.isEmpty, "the broker needs at least one provider")
        var endpoints: [String: Endpoint] = [:]
        for provider in providers {
            endpoints[provider.name] = Endpoint(
                provider: provider,
                responses: TokenResponseCache(providerName: provider.name, cookie: provider.cookie),
                routePrefix: "/providers/{name}", metrics: metrics)
        }
        self.endpoints = endpoints
        defaultEndpoint = Endpoint(
            provider: providers[0], responses: endpoints[providers[0].name]!.responses, routePrefix: "",
            metrics: metrics)
        jwksCounter = metrics.counter(listener: "token", route: "/.well-known/jwks.json")
        unknownProviderCounter = metrics.counter(listener: "token", route: "/providers/{name}")
        otherCounter = metrics.counter(listener: "token", route: "other")
        self.jwks = HTTPResponse(status: 200, json: jwks, headers: [("Cache-Control", "public, max-age=300")])
        self.maxWait = maxWait
        self.guardRequests = requestGuard
        self.callers = callers
        self.proxy = proxy
        proxyCounter = metrics.counter(listener: "token", route: "/proxy/{name}")
        self.metrics = metrics
    }

    public func refusal(_ reason: ServerRefusal) -> HTTPResponse { ErrorAnswer.refusal(reason).response }

    // The server calls this through `HTTPHandler`, whose witness is generic: the attribute makes
    // it dispatch to a version specialised for the broker's own provider, so that the request
    // path runs no generic code (as it did when the routes named `TokenProvider` themselves).
    @_specialize(where Provider == TokenProvider<ContinuousClock>)
    public func handle(_ request: HTTPRequest) -> HTTPReply {
        let path = request.path
        if let proxy, let target = request.rawTarget { return proxied(request, target: target, proxy: proxy) }
        guard path.hasPrefix("/") else { return record(otherCounter, .response(ErrorAnswer.absoluteForm.response)) }
        if path == "/.well-known/jwks.json" {
            return record(jwksCounter, Methods.only(Methods.read, request) ?? .response(jwks))
        }
        var endpoint = defaultEndpoint
        var rest = Substring(path)
        if path.hasPrefix("/providers/") {
            let tail = path.dropFirst("/providers/".count)
            let name = tail.prefix { $0 != "/" }
            guard name.count < tail.count else {
                return record(otherCounter, .response(ErrorAnswer.notFound(path: path).response))
            }
            guard let named = endpoints[String(name)] else {
                return record(
                    unknownProviderCounter, .response(ErrorAnswer.unknownProvider(name: String(name)).response))
            }
            endpoint = named
            rest = tail[name.endIndex...]
        }
        let route: Route
        switch rest {
        case "/token": route = .token
        case "/token/ready": route = .ready
        case "/token/refresh": route = .refresh
        default: return record(otherCounter, .response(ErrorAnswer.notFound(path: path).response))
        }
        let label = endpoint.counter(route)
        if let refusal = Methods.only(route == .refresh ? Methods.post : Methods.read, request) {
            return record(label, refusal)
        }
        if let refusal = admit(request, provider: endpoint.provider.name) {
            return record(label, .response(refusal.response))
        }
        switch route {
        case .token: return token(endpoint, label: label)
        case .ready: return ready(endpoint, request, label: label)
        case .refresh: return refresh(endpoint, request, label: label)
        }
    }

    // MARK: - Shared helpers

    /// Nil when the request passes the request guard and the caller check, else the refusal.
    func admit(_ request: HTTPRequest, provider: String) -> ErrorAnswer? {
        if guardRequests, let refusal = RequestGuard.check(request) { return refusal }
        if let callers {
            return CallerCheck.refusal(
                callers.authorize(request.header("Authorization"), provider: provider), provider: provider)
        }
        return nil
    }

    /// Counts an immediate answer under its route; deferred ones count when answered.
    func record(_ counter: RequestCounter, _ reply: HTTPReply) -> HTTPReply {
        if case .response(let response) = reply { counter.record(status: response.status) }
        return reply
    }

    /// Answers a suspended request and counts it.
    func answer(_ responder: any HTTPResponding, _ response: HTTPResponse, route: RequestCounter) {
        route.record(status: response.status)
        responder.respond(response)
    }

    /// The 503 for a provider without a valid token, saying why when it knows.
    /// - Parameter wasPaused: the request found the provider paused while idle (and woke it).
    static func unavailable(_ provider: Provider, wasPaused: Bool = false) -> HTTPResponse {
        let status = provider.status()
        return ErrorAnswer.tokenUnavailable(
            provider: provider.name, lastError: status.lastError, paused: wasPaused || status.phase == .paused
        )
        .response
    }
}
