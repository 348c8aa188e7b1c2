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
/// (`clientKeysFile`), the caller check (`CallerCheck`). A request that waits (a long-poll, a
/// refresh, a first token, a token fetched on demand) is checked again when it is answered
/// (`answer(_:caller:route:_:)`): the keys file may have been re-read meanwhile. Error answers
/// are worded in `ErrorAnswer`.
///
/// A request that waits holds one of the listener's places for waiting requests (the server's
/// `WaitingPlaces`: none free, and the server answers `refusal(.tooManyWaiting)`) and, when
/// callers have keys, one of its key's (`KeyWaitingPlaces`, taken in `deferred(caller:label:_:)`).
///
/// A provider template (`perRequest`) answers the same routes through its children: the query's
/// `audience`, `scope` and `resource`, checked against the template's allow-lists
/// (`TokenRequestValues.checked`), name the child; none names the template's default child. A
/// child that never held a token makes its `/token` wait for the first one, at most `maxWait`.
/// Caller keys allowed the template are allowed its children; the request counters are the
/// template's. An ordinary provider refuses those parameters.
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
            self.init(
                provider: provider, responses: responses,
                counters: Route.counters(routePrefix: routePrefix, metrics: metrics))
        }

        /// A template's child, counted under its template's counters.
        init(provider: Provider, responses: TokenResponseCache<Provider.Instant>, counters: [RequestCounter]) {
            self.provider = provider
            self.responses = responses
            self.counters = counters
        }

        func counter(_ route: Route) -> RequestCounter { counters[route.index] }
    }

    /// One template and what its routes keep; its children are made per request.
    ///
    /// A class, so that passing it along a request (in `Target`) costs one reference count, not
    /// one per reference in its settings, which are many.
    final class TemplateEndpoint: Sendable {
        let template: any TemplateProviding<Provider>
        /// The template's name and settings, read once rather than through `template` per request.
        let name: String
        let configuration: ProviderConfiguration
        /// As `Endpoint.counters`: one set for the template, whichever child answers.
        let counters: [RequestCounter]
        /// The values last checked for the parameters a request named, with their child.
        let memo: CheckedValuesMemo<QueryParameters.RequestValues, Provider>

        init(template: any TemplateProviding<Provider>, counters: [RequestCounter]) {
            self.template = template
            name = template.name
            configuration = template.configuration
            self.counters = counters
            memo = CheckedValuesMemo(template)
        }

        func counter(_ route: Route) -> RequestCounter { counters[route.index] }
    }

    /// What a name, or the routes without `/providers/{name}`, lead to.
    enum Target: Sendable {
        case provider(Endpoint)
        case template(TemplateEndpoint)

        var name: String {
            switch self {
            case .provider(let endpoint): endpoint.provider.name
            case .template(let endpoint): endpoint.name
            }
        }
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

        /// The route `rest` (the path, or what follows a provider's name) names; nil: none. Told
        /// apart by length before any comparison: most other paths (the cloud SDK protocols',
        /// under `/computeMetadata/` or `/msi/`) are none of these lengths, and are not compared.
        /// The answer is `==`'s: the only characters canonically equivalent to ASCII ones are
        /// U+212A (`K`), U+037E (`;`) and U+1FEF (`` ` ``), which these paths do not hold, so no
        /// text of another length is equal to one of them.
        static func named(_ rest: Substring) -> Route? {
            switch rest.utf8.count {
            case 6: rest == "/token" ? .token : nil
            case 12: rest == "/token/ready" ? .ready : nil
            case 14: rest == "/token/refresh" ? .refresh : nil
            default: nil
            }
        }

        /// The request counters of the three routes under `routePrefix`, in `Route` order.
        static func counters(routePrefix: String, metrics: BrokerMetrics) -> [RequestCounter] {
            allCases.map { metrics.counter(listener: "token", route: routePrefix + $0.rawValue) }
        }
    }

    let targets: [String: Target]
    let defaultTarget: Target
    let maxWait: Duration
    let metrics: BrokerMetrics
    private let guardRequests: Bool
    let callers: (any CallerRechecking)?
    /// The waiting places each caller key holds; nil without caller keys.
    private let keyPlaces: KeyWaitingPlaces?
    /// Proxy mode's routes, present only when proxies are configured (the server then streams
    /// requests under `/proxy/` to `begin`, with their raw target).
    let proxy: (any ProxyHandling)?
    let proxyCounter: RequestCounter
    /// The cloud SDK protocols' routes served on this listener (`CompatAPI`), when configured so.
    let compat: CompatAPI<Provider>?
    private let jwks: HTTPResponse
    private let jwksCounter: RequestCounter
    private let unknownProviderCounter: RequestCounter
    private let otherCounter: RequestCounter

    /// - Parameters:
    ///   - providers: the ordinary providers.
    ///   - templates: the provider templates (`perRequest`).
    ///   - defaultName: the provider or template that answers the routes without
    ///     `/providers/{name}` (the first configured); nil: the first provider, else the first template.
    ///   - jwks: the JWK Set document to publish.
    ///   - maxWait: the longest a request waits (long-polls, on-demand fetches, refreshes).
    ///   - requestGuard: require `Token-Broker-Request: true` and refuse `X-Forwarded-For` and `Forwarded`.
    ///   - callers: who may read which provider; nil lets every client read every provider.
    ///   - keyPlaces: with `callers`, the waiting places each key holds, shared by every routes
    ///     made for the listener (a reload's too), so that a key's waits count wherever they began.
    ///   - proxy: proxy mode's routes, when proxies are configured.
    ///   - compat: the cloud SDK protocols' routes, when served on this listener: their paths
    ///     (`/`, `/computeMetadata/…`, `/msi/token`, `/metadata/identity/…`) are handed to them.
    public init(
        providers: [Provider], templates: [any TemplateProviding<Provider>] = [], defaultName: String? = nil,
        jwks: String, maxWait: Duration, requestGuard: Bool = true, callers: (any CallerRechecking)? = nil,
        keyPlaces: KeyWaitingPlaces? = nil, proxy: (any ProxyHandling)? = nil, compat: CompatAPI<Provider>? = nil,
        metrics: BrokerMetrics
    ) {
        precondition(!providers.isEmpty || !templates.isEmpty, "the broker needs at least one provider")
        var targets: [String: Target] = [:]
        var defaults: [String: Target] = [:]
        for provider in providers {
            let responses = TokenResponseCache(for: provider)
            targets[provider.name] = .provider(
                Endpoint(provider: provider, responses: responses, routePrefix: "/providers/{name}", metrics: metrics))
            defaults[provider.name] = .provider(
                Endpoint(provider: provider, responses: responses, routePrefix: "", metrics: metrics))
        }
        for template in templates {
            targets[template.name] = .template(
                TemplateEndpoint(
                    template: template, counters: Route.counters(routePrefix: "/providers/{name}", metrics: metrics)))
            defaults[template.name] = .template(
                TemplateEndpoint(template: template, counters: Route.counters(routePrefix: "", metrics: metrics)))
        }
        self.targets = targets
        let defaultName = defaultName ?? providers.first?.name ?? templates[0].name
        guard let defaultTarget = defaults[defaultName] else {
            preconditionFailure("the default provider \(defaultName) is not among the providers")
        }
        self.defaultTarget = defaultTarget
        jwksCounter = metrics.counter(listener: "token", route: "/.well-known/jwks.json")
        unknownProviderCounter = metrics.counter(listener: "token", route: "/providers/{name}")
        otherCounter = metrics.counter(listener: "token", route: "other")
        self.jwks = HTTPResponse(status: 200, json: jwks, headers: [("Cache-Control", "public, max-age=300")])
        self.maxWait = maxWait
        self.guardRequests = requestGuard
        self.callers = callers
        self.keyPlaces = callers == nil ? nil : keyPlaces
        self.proxy = proxy
        self.compat = compat
        proxyCounter = metrics.counter(listener: "token", route: "/proxy/{name}")
        self.metrics = metrics
    }

    /// The server's refusals, in the broker's shape; a cloud SDK protocol's route served here
    /// gets a wait refused in its protocol's shape.
    public func refusal(_ reason: ServerRefusal) -> HTTPResponse {
        if case .tooManyWaiting(let path, _) = reason, let compat, CompatAPI<Provider>.mayServe(path),
            compat.serves(path)
        {
            return compat.refusal(reason)
        }
        return ErrorAnswer.refusal(reason).response
    }

    // The server calls this through `HTTPHandler`, whose witness is generic: the attribute makes
    // it dispatch to a version specialised for the broker's own provider, so that the request
    // path runs no generic code (as it did when the routes named `TokenProvider` themselves).
    @_specialize(where Provider == TokenProvider<ContinuousClock>)
    public func handle(_ request: HTTPRequest) -> HTTPReply {
        let path = request.path
        if let proxy, let target = request.rawTarget { return proxied(request, target: target, proxy: proxy) }
        guard path.utf8.first == UInt8(ascii: "/") else {
            return record(otherCounter, .response(ErrorAnswer.absoluteForm.response))
        }
        // The cloud SDK protocols' paths, when served here, are none of the broker's own: they
        // are handed over before the broker's routes are tried, by a test of two bytes that the
        // broker's own routes do not pass.
        if let compat, CompatAPI<Provider>.mayServe(path), let answer = compat.answer(request) { return answer }
        if path == "/.well-known/jwks.json" {
            return record(jwksCounter, Methods.only(Methods.read, request) ?? .response(jwks))
        }
        var target = defaultTarget
        var rest = Substring(path)
        if path.hasPrefix("/providers/") {
            let tail = path.dropFirst("/providers/".count)
            let name = tail.prefix { $0 != "/" }
            guard name.endIndex < tail.endIndex else {
                return record(otherCounter, .response(ErrorAnswer.notFound(path: path).response))
            }
            guard let named = targets[String(name)] else {
                // The caller first, as for a provider that exists: a name's existence is told only
                // to a caller who may read it, so that names cannot be tried without a key.
                let name = String(name)
                let refusal = admit(request, provider: name) ?? .unknownProvider(name: name)
                return record(unknownProviderCounter, .response(refusal.response))
            }
            target = named
            rest = tail[name.endIndex...]
            // A route that is none of a provider's: the caller first, for the same reason.
            if Route.named(rest) == nil, let refusal = admit(request, provider: named.name) {
                return record(otherCounter, .response(refusal.response))
            }
        }
        guard let route = Route.named(rest) else {
            if proxy == nil, let refusal = proxyNotConfigured(request) {
                return record(proxyCounter, .response(refusal))
            }
            return record(otherCounter, .response(ErrorAnswer.notFound(path: path).response))
        }
        let label: RequestCounter
        switch target {
        case .provider(let endpoint): label = endpoint.counter(route)
        case .template(let endpoint): label = endpoint.counter(route)
        }
        // The caller before the method: a 405 would tell a caller who may not read the provider
        // that it exists, where an unknown name gets the caller's refusal (above).
        var caller: AdmittedCaller?
        if let refusal = admit(request, provider: target.name, caller: &caller) {
            return record(label, .response(refusal.response))
        }
        if let refusal = Methods.only(route == .refresh ? Methods.post : Methods.read, request) {
            return record(label, refusal)
        }
        // The route's own parameters before the provider: a request refused for them makes no
        // template child, so causes no fetch and takes no room under `maxChildren`.
        let asked: RouteParameters
        do throws(BadRequest) {
            asked = try RouteParameters(route, request, maxWait: maxWait)
        } catch {
            return record(label, .response(error.answer.response))
        }
        let endpoint: Endpoint
        let isChild: Bool
        switch answering(target, request) {
        case .success(let found): (endpoint, isChild) = found
        case .failure(let refusal): return record(label, .response(refusal.answer.response))
        }
        switch asked {
        case .token: return token(endpoint, waitForFirstToken: isChild, caller: caller, label: label)
        case .ready(let poll): return ready(endpoint, poll, caller: caller, label: label)
        case .refresh(let rejected, let timeout):
            return refresh(endpoint, rejected: rejected, timeout: timeout, caller: caller, label: label)
        }
    }

    /// The provider that answers: the target itself, or the template's child for the values the
    /// query names (true when it is a child). Refused: a parameter given twice, one the provider
    /// does not take, a malformed value or one outside the allow-list (none of which makes a
    /// child), and a template that has no room for another child.
    private func answering(_ target: Target, _ request: HTTPRequest) -> Result<(Endpoint, Bool), BadRequest> {
        let named: QueryParameters.RequestValues
        do {
            named = try QueryParameters.requestValues(request)
        } catch {
            return .failure(error)
        }
        switch target {
        case .provider(let endpoint):
            if let parameter = named.first {
                return .failure(
                    BadRequest(
                        .requestValue(
                            RequestValueProblem(parameter: parameter, kind: .notAccepted),
                            provider: endpoint.provider.name)))
            }
            return .success((endpoint, false))
        case .template(let endpoint):
            let found: Result<LeasedChild<Provider>, ChildRefusal>
            do throws(BadRequest) {
                found = try endpoint.memo.child(for: named) { () throws(BadRequest) in
                    switch TokenRequestValues.checked(
                        audience: named.audience, scope: named.scope, resource: named.resource,
                        for: endpoint.configuration)
                    {
                    case .success(let checked): return checked
                    case .failure(let problem): throw BadRequest(.requestValue(problem, provider: endpoint.name))
                    }
                }
            } catch {
                return .failure(error)
            }
            switch found {
            case .success(let leased):
                return .success(
                    (Endpoint(provider: leased.child, responses: leased.cache, counters: endpoint.counters), true))
            case .failure(.full(let limit, let retryAfter)):
                return .failure(
                    BadRequest(.tooManyChildren(provider: endpoint.name, limit: limit, retryAfter: retryAfter)))
            case .failure(.stopped):
                return .failure(BadRequest(.shuttingDown))
            }
        }
    }

    // MARK: - Shared helpers

    /// Nil when the request passes the request guard and the caller check, else the refusal.
    func admit(_ request: HTTPRequest, provider: String) -> ErrorAnswer? {
        var caller: AdmittedCaller?
        return admit(request, provider: provider, caller: &caller)
    }

    /// `admit(_:provider:)`, which also sets `caller` to the caller let in, when callers have
    /// keys, for the answer to check again if the request waits (`answer(_:caller:route:_:)`).
    func admit(_ request: HTTPRequest, provider: String, caller: inout AdmittedCaller?) -> ErrorAnswer? {
        if guardRequests, let refusal = RequestGuard.check(request) { return refusal }
        if let callers {
            // The header's bytes as sent, not a string made of them (`CallerAuthorizing`).
            let admission =
                request.headers.firstIndex(named: "Authorization").map { index in
                    request.headers.withValue(at: index) { callers.admit($0, provider: provider) }
                } ?? callers.admit(UnsafeBufferPointer<UInt8>?.none, provider: provider)
            switch admission {
            case .allowed(let admitted): caller = admitted
            case .refused(let decision): return CallerCheck.refusal(decision, provider: provider)
            }
        }
        return nil
    }

    /// `.deferred(start)`, with one of `caller`'s waiting places held while the request waits
    /// (`KeyWaitingPlaces`): taken once the server has found the request a place of its own
    /// (else `start` never runs), given back when the wait ends, however it ends. A key holding
    /// its share gets 429 `too_many_waiting_for_key` at once, counted under `label`, and
    /// `start` does not run. Nil `caller` (callers have no keys): `.deferred(start)` as it is.
    /// - Parameter refused: also runs with that 429, before it is sent (proxy mode counts it
    ///   by proxy, and stops reading a streamed body).
    func deferred(
        caller: AdmittedCaller?, label: RequestCounter, refused: (@Sendable (HTTPResponse) -> Void)? = nil,
        _ start: @escaping @Sendable (any HTTPResponding) -> Void
    ) -> HTTPReply {
        guard let caller, let keyPlaces else { return .deferred(start) }
        return .deferred { [self] responder in
            let key = caller.keyDigest
            guard keyPlaces.take(key) else {
                let response = keyShareRefusal()
                refused?(response)
                answer(responder, response, route: label)
                return
            }
            responder.whenWaitEnds { keyPlaces.giveBack(key) }
            start(responder)
        }
    }

    /// Whether `caller`'s key holds its share of waiting places already (false without keys). A
    /// look only, for a route to refuse before it starts what the wait is for (a forced refresh):
    /// `deferred(caller:label:_:)` takes the place, exactly.
    func keyHoldsItsShare(_ caller: AdmittedCaller?) -> Bool {
        guard let caller, let keyPlaces else { return false }
        return keyPlaces.holding(caller.keyDigest) >= keyPlaces.limit
    }

    /// The 429 `too_many_waiting_for_key`, counted.
    func keyShareRefusal() -> HTTPResponse {
        metrics.recordWaitRefused(listener: "token", limit: .callerKey)
        return ErrorAnswer.tooManyWaitingForKey(places: keyPlaces?.limit ?? 0).response
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

    /// Answers a suspended request with `response()`, unless `caller`, let in when it arrived,
    /// may no longer read the provider by the callers listed now (the keys file was re-read
    /// while it waited): then with the 401 or 403 that `admit` would give it now, and the
    /// answer is not made. Nil `caller`: callers have no keys.
    func answer(
        _ responder: any HTTPResponding, caller: AdmittedCaller?, route: RequestCounter,
        _ response: () -> HTTPResponse
    ) {
        if let caller, let callers,
            let refusal = CallerCheck.refusal(callers.recheck(caller), provider: caller.provider)
        {
            answer(responder, refusal.response, route: route)
            return
        }
        answer(responder, response(), route: route)
    }

    /// The 503 for a provider without a valid token, saying why when it knows.
    /// - Parameter wasPaused: the request found the provider paused while idle (and woke it).
    static func unavailable(_ provider: Provider, wasPaused: Bool = false) -> HTTPResponse {
        let status = provider.status()
        return ErrorAnswer.tokenUnavailable(
            provider: provider.name, lastError: status.lastError, paused: wasPaused || status.phase == .paused,
            retryAfter: status.heldOffFor
        )
        .response
    }
}

extension TokenAPI {
    /// What a token route's request asks besides its provider (and its child's values): read and
    /// checked before the provider answers, so that a request refused for them (400) makes no
    /// template child.
    enum RouteParameters {
        /// `/token` reads none.
        case token
        case ready(LongPollParameters)
        /// `/token/refresh`: the body's `rejected_version`, and `timeout`.
        case refresh(rejected: UInt64?, timeout: Duration)

        init(_ route: Route, _ request: HTTPRequest, maxWait: Duration) throws(BadRequest) {
            switch route {
            case .token:
                self = .token
            case .ready:
                self = .ready(try LongPollParameters(request, maxWait: maxWait))
            case .refresh:
                let rejected = try RefreshRequestBody.rejectedVersion(request)
                // A refresh always gets a moment to finish: 0 would only ever answer "not in time".
                self = .refresh(
                    rejected: rejected, timeout: try QueryParameters.timeout(request, minimum: 1, maximum: maxWait))
            }
        }
    }
}
