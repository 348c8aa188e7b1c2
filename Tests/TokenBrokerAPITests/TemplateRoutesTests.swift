// The token routes over a provider template (perRequest): each combination of values asked for
// is a child of its own, made on the first request, which waits for the child's first token;
// values are checked (400 naming the parameter) before any child exists; maxChildren is a 503
// with Retry-After; caller keys allowed the template are allowed its children.
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerTestSupport

@testable import TokenBrokerAPI

/// A child's source: hands out a token naming the values it was made for (`tok-1:audience="…"`), counting every
/// fetch of every child in `fetches`; with a gate, fetches wait until the test opens it.
final class ValuesSource: TokenSource {
    /// Fetches of all the children's sources, and the gate they share.
    final class Shared: Sendable {
        let fetches = Mutex<[String]>([])
        let gate = Mutex<(open: Bool, parked: [CheckedContinuation<Void, Never>])>((true, []))
        let fails: Bool

        init(gated: Bool = false, fails: Bool = false) {
            gate.withLock { $0.open = !gated }
            self.fails = fails
        }

        var count: Int { fetches.withLock { $0.count } }
        var parked: Int { gate.withLock { $0.parked.count } }

        func open() {
            let parked = gate.withLock { gate in
                gate.open = true
                defer { gate.parked = [] }
                return gate.parked
            }
            for continuation in parked { continuation.resume() }
        }
    }

    private let values: TokenRequestValues
    private let shared: Shared

    init(_ values: TokenRequestValues, shared: Shared) {
        self.values = values
        self.shared = shared
    }

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        let number = shared.fetches.withLock { fetches in
            fetches.append(values.description)
            return fetches.count
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = shared.gate.withLock { gate in
                if gate.open { return true }
                gate.parked.append(continuation)
                return false
            }
            if proceed { continuation.resume() }
        }
        if shared.fails { throw .unreachable("connection refused") }
        // A token is visible ASCII: the values' spaces become `+`.
        let named = String(values.description.map { $0 == " " ? "+" : $0 })
        return FetchedToken(accessToken: "tok-\(number):\(named)", lifetime: .seconds(900))
    }
}

/// The broker's template type, on the real clock.
typealias LiveTemplate = ProviderTemplate<TokenProvider<ContinuousClock>, ChildAttachment, ContinuousClock>

/// A template `orders` taking audience and scope, made as the broker makes one.
func liveTemplate(
    name: String = "orders", maxChildren: Int = 100, perRequest: Set<RequestParameter> = [.audience, .scope],
    backgroundRefresh: Bool = true, source: SourceConfiguration? = nil, shared: ValuesSource.Shared
) -> LiveTemplate {
    var configuration = ProviderConfiguration(name: name, backgroundRefreshEnabled: backgroundRefresh)
    if let source { configuration.source = source }
    configuration.perRequest = perRequest
    if perRequest.contains(.audience) {
        configuration.allowedAudiences = [
            AllowPattern("https://orders.example")!, AllowPattern("https://api.example/*")!,
        ]
    }
    if perRequest.contains(.scope) { configuration.allowedScopes = [AllowPattern("read")!, AllowPattern("write")!] }
    configuration.maxChildren = maxChildren
    let settings = configuration
    return LiveTemplate(
        configuration: settings, clock: ContinuousClock(),
        makeChild: { values, _ in
            TokenProvider(configuration: settings, source: ValuesSource(values, shared: shared))
        },
        attach: { TokenResponseCache(for: $0) })
}

/// Callers by key: `Bearer orders` may read `orders` only, `Bearer other` nothing.
struct TemplateCallers: FixedCallers {
    func authorize(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerDecision {
        // The bytes as sent, compared as bytes: a string made of them would not be.
        guard let authorization else { return .missingKey }
        if authorization.elementsEqual("Bearer orders".utf8) {
            return provider == "orders" ? .allowed : .forbidden(caller: "orders")
        }
        if authorization.elementsEqual("Bearer other".utf8) { return .forbidden(caller: "other") }
        return .unknownKey
    }
}

@Suite struct TemplateRoutesTests {
    private func api(
        providers: [TokenProvider<ContinuousClock>] = [], templates: [LiveTemplate], defaultName: String? = nil,
        maxWait: Duration = .seconds(30), callers: (any CallerRechecking)? = nil,
        metrics: BrokerMetrics = BrokerMetrics(version: "test")
    ) -> TokenAPI<TokenProvider<ContinuousClock>> {
        TokenAPI(
            providers: providers, templates: templates, defaultName: defaultName, jwks: "{}", maxWait: maxWait,
            callers: callers, metrics: metrics)
    }

    private func token(_ path: String, _ query: [(String, String)], headers: [(String, String)] = []) -> HTTPRequest {
        request(path, query: query, headers: headers)
    }

    @Test func eachAudienceHasItsOwnChildWhoseFirstRequestWaitsForItsFirstToken() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template])
        await running([template]) {
            let first = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")]))
            #expect(first.immediate == nil, "a new child's first request waits for its token")
            let orders = await answer(first)
            #expect(orders?.status == 200)
            #expect(orders?.string("access_token") == #"tok-1:audience="https://orders.example""#)
            #expect(orders?.string("provider") == "orders" && orders?.int("version") == 1)
            let other = await answer(
                api.handle(token("/providers/orders/token", [("audience", "https://api.example/v2")])))
            #expect(other?.string("access_token") == #"tok-2:audience="https://api.example/v2""#)
            // Known children answer at once, from their own cache.
            let again = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")])).immediate
            #expect(again?.status == 200 && again?.string("access_token") == orders?.string("access_token"))
            let scoped = await answer(
                api.handle(
                    token("/providers/orders/token", [("audience", "https://orders.example"), ("scope", "write read")]))
            )
            #expect(
                scoped?.string("access_token") == #"tok-3:audience="https://orders.example"+scope="read+write""#)
            let sameSet = api.handle(
                token("/providers/orders/token", [("scope", "read write"), ("audience", "https://orders.example")]))
            #expect(sameSet.immediate?.string("access_token") == scoped?.string("access_token"))
            #expect(shared.count == 3)
            #expect(template.status().children == 3)
        }
    }

    @Test func concurrentFirstRequestsShareTheChildsOneFetch() async {
        let shared = ValuesSource.Shared(gated: true)
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template])
        await running([template]) {
            var responders: [RecordingResponder] = []
            for _ in 0..<50 {
                let responder = RecordingResponder()
                let reply = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")]))
                #expect(reply.start(responder), "deferred while the child has no token")
                responders.append(responder)
            }
            #expect(await eventually { shared.parked == 1 })
            shared.open()
            #expect(await eventually { responders.allSatisfy { !$0.responses.isEmpty } })
            let tokens = Set(responders.compactMap { $0.responses.first?.string("access_token") })
            #expect(tokens == [#"tok-1:audience="https://orders.example""#])
            #expect(shared.count == 1)
        }
    }

    @Test func readyAndRefreshServeTheChildNamedByTheQuery() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template])
        await running([template]) {
            let ready = await answer(
                api.handle(token("/providers/orders/token/ready", [("audience", "https://api.example/a")])))
            #expect(
                ready?.status == 200 && ready?.string("access_token") == #"tok-1:audience="https://api.example/a""#)
            let refreshed = await answer(
                api.handle(
                    request(
                        "POST", "/providers/orders/token/refresh", query: [("audience", "https://api.example/a")],
                        body: #"{"rejected_version": 1}"#)))
            #expect(refreshed?.status == 200)
            #expect(refreshed?.string("access_token") == #"tok-2:audience="https://api.example/a""#)
            #expect(refreshed?.int("version") == 2)
            #expect(template.status().children == 1)
        }
    }

    @Test func aTemplateFirstInTheConfigurationAnswersTheBareRoutesAndNoValueIsItsDefaultChild() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(shared: shared)
        let plain = TokenProvider(configuration: ProviderConfiguration(name: "plain"), source: CountingSource())
        let plainTask = Task { await plain.run() }
        defer { plainTask.cancel() }
        let api = api(providers: [plain], templates: [template], defaultName: "orders")
        await running([template]) {
            let defaults = await answer(api.handle(token("/token", [])))
            #expect(defaults?.string("access_token") == "tok-1:defaults")
            let named = await answer(api.handle(token("/token", [("audience", "https://orders.example")])))
            #expect(named?.string("access_token") == #"tok-2:audience="https://orders.example""#)
            #expect(template.status().children == 2)
            #expect(await eventually { plain.status().version == 1 })
            #expect(api.handle(token("/providers/plain/token", [])).immediate?.string("access_token") == "tok-1")
        }
    }

    @Test func valuesAreCheckedBeforeAnyChildIsMadeAndEachErrorNamesItsParameter() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(perRequest: [.audience], shared: shared)
        let plain = TokenProvider(configuration: ProviderConfiguration(name: "plain"), source: CountingSource())
        let api = TokenAPI(
            providers: [plain], templates: [AnyTemplate(template)], jwks: "{}", maxWait: .seconds(30),
            metrics: BrokerMetrics(version: "test"))
        await running([template]) {
            let cases: [(String, [(String, String)], String, String)] = [
                ("/providers/orders/token", [("audience", "https://evil.example")], "value_not_allowed", "audience"),
                ("/providers/orders/token", [("audience", "https://api.example")], "value_not_allowed", "audience"),
                ("/providers/orders/token/ready", [("audience", "")], "invalid_request", "audience"),
                ("/providers/orders/token", [("audience", "https://api.example/a b")], "invalid_request", "audience"),
                ("/providers/orders/token", [("scope", "read")], "invalid_request", "scope"),
                ("/providers/orders/token", [("resource", "urn:x")], "invalid_request", "resource"),
                ("/providers/plain/token", [("audience", "https://orders.example")], "invalid_request", "audience"),
                ("/token", [("scope", "read")], "invalid_request", "scope"),
            ]
            for (path, query, code, parameter) in cases {
                let response = api.handle(token(path, query)).immediate
                expectError(response, 400, code)
                #expect(response?.string("parameter") == parameter, "\(path) \(query)")
            }
            let refresh = api.handle(
                request("POST", "/providers/orders/token/refresh", query: [("audience", "https://evil.example")]))
            expectError(refresh.immediate, 400, "value_not_allowed")
            let repeated = api.handle(
                token(
                    "/providers/orders/token",
                    [("audience", "https://orders.example"), ("audience", "https://orders.example")])
            ).immediate
            expectError(repeated, 400, "invalid_request")
            #expect(repeated?.string("error_description") == "audience is given more than once")
            #expect(template.status().children == 0, "no child for a refused value")
            #expect(shared.count == 0, "and no fetch")
        }
    }

    /// `after`, `timeout` and the retrier's body are the route's, read before the child is made:
    /// a request refused for them (400) makes no child, causes no fetch and takes no room under
    /// `maxChildren`. They were read after, so three such requests filled a template of three.
    @Test func aRequestRefusedForItsRoutesParametersMakesNoChild() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(maxChildren: 1, perRequest: [.audience], shared: shared)
        let api = api(templates: [template])
        await running([template]) {
            let refused: [HTTPRequest] = [
                token("/providers/orders/token/ready", [("audience", "https://api.example/1"), ("after", "x")]),
                token("/token/ready", [("audience", "https://api.example/2"), ("timeout", "-1")]),
                token("/token/ready", [("audience", "https://api.example/3"), ("after", "1"), ("after", "2")]),
                request("POST", "/token/refresh", query: [("audience", "https://api.example/4")], body: "not json"),
                request(
                    "POST", "/providers/orders/token/refresh",
                    query: [("audience", "https://api.example/5"), ("timeout", "0")]),
                request("POST", "/token/refresh", query: [("audience", "https://api.example/6")], bodyTooLarge: true),
            ]
            for request in refused {
                let response = api.handle(request).immediate
                #expect(response?.status == 400 || response?.status == 413, "\(request.path) \(request.query.pairs)")
            }
            #expect(template.status().children == 0, "no child for a refused request")
            #expect(shared.count == 0, "and no fetch")
            // The one child there is room for is made for a request that is answered; `If-None-Match: *`
            // is the version of the child it names, read once the child is made.
            let first = await answer(
                api.handle(token("/token/ready", [("audience", "https://api.example/7")])))
            #expect(first?.status == 200 && first?.int("version") == 1)
            let poll = api.handle(
                token(
                    "/token/ready", [("audience", "https://api.example/7"), ("timeout", "0")],
                    headers: [("If-None-Match", "*")]))
            #expect(await answer(poll)?.status == 304)
            #expect(template.status().children == 1 && shared.count == 1)
        }
    }

    @Test func theValuesKeptFromTheLastRequestNeverLetAnotherRequestsValuesThrough() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(perRequest: [.audience], shared: shared)
        let api = api(templates: [template])
        await running([template]) {
            let allowed = [("audience", "https://orders.example")]
            #expect(await answer(api.handle(token("/providers/orders/token", allowed)))?.status == 200)
            // Each refused between two accepted requests of the same values: checked, not taken
            // for the values kept.
            let refusals: [([(String, String)], String)] = [
                ([("audience", "https://evil.example")], "value_not_allowed"),
                ([("audience", "https://orders.example"), ("scope", "read")], "invalid_request"),
                ([("audience", "https://orders.example"), ("resource", "urn:x")], "invalid_request"),
                ([("audience", "https://orders.example/a b")], "invalid_request"),
                ([("AUDIENCE", "https://orders.example"), ("audience", "https://orders.example")], "invalid_request"),
            ]
            for (query, code) in refusals {
                let again = api.handle(token("/providers/orders/token", allowed)).immediate
                #expect(again?.status == 200)
                expectError(api.handle(token("/providers/orders/token", query)).immediate, 400, code)
            }
            // Equal to the values kept by `String`'s `==` (KELVIN SIGN is canonically `K`), not by
            // bytes: checked, and refused as the bytes are not ASCII.
            let ascii = [("audience", "https://api.example/K")]
            #expect(await answer(api.handle(token("/providers/orders/token", ascii)))?.status == 200)
            let kelvin = [("audience", "https://api.example/\u{212A}")]
            expectError(api.handle(token("/providers/orders/token", kelvin)).immediate, 400, "invalid_request")
            #expect(template.status().children == 2 && shared.count == 2)
        }
    }

    @Test func anHTTPTemplatesPlaceholderHasNoDefaultSoEveryRequestMustNameItsValue() async {
        let shared = ValuesSource.Shared()
        var http = HTTPSourceConfiguration(url: "https://tokens.example/issue?aud={{audience}}")
        http.headers = ["Content-Type": .value("application/json")]
        http.body = #"{"scope": "{{scope}}"}"#
        let template = liveTemplate(source: .http(http), shared: shared)
        let api = api(templates: [template], defaultName: "orders")
        await running([template]) {
            let cases: [(String, [(String, String)], String)] = [
                ("/providers/orders/token", [], "audience"),
                ("/token", [], "audience"),
                ("/providers/orders/token/ready", [("scope", "read")], "audience"),
                ("/providers/orders/token", [("audience", "https://orders.example")], "scope"),
            ]
            for (path, query, parameter) in cases {
                let response = api.handle(token(path, query)).immediate
                expectError(response, 400, "invalid_request")
                #expect(response?.string("parameter") == parameter, "\(path) \(query)")
                #expect(
                    response?.string("error_description")?.hasPrefix("\(parameter) is required by this template")
                        == true, "\(path) \(query)")
            }
            let refresh = api.handle(request("POST", "/providers/orders/token/refresh", query: [("scope", "read")]))
            expectError(refresh.immediate, 400, "invalid_request")
            #expect(template.status().children == 0, "no child without the values")
            #expect(shared.count == 0, "and no fetch")
            // Both named: the child is made and fetches.
            let named = await answer(
                api.handle(
                    token("/providers/orders/token", [("audience", "https://orders.example"), ("scope", "read")])))
            #expect(named?.string("access_token") == #"tok-1:audience="https://orders.example"+scope="read""#)
        }
    }

    @Test func aParameterWithoutEqualsSignIsMalformedNotLeftOut() async {
        let shared = ValuesSource.Shared()
        // The local signer's template: a value left out is its configured default, so a bare
        // `?audience` must not pass for one left out.
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template], defaultName: "orders")
        await running([template]) {
            for path in ["/providers/orders/token", "/providers/orders/token/ready", "/token"] {
                for bare in ["audience", "scope"] {
                    let response = api.handle(
                        HTTPRequest(
                            method: "GET", path: path, query: [(bare, nil)],
                            headers: [("Token-Broker-Request", "true")])
                    ).immediate
                    expectError(response, 400, "invalid_request")
                    #expect(response?.string("parameter") == bare, "\(path)?\(bare)")
                }
            }
            let repeated = api.handle(
                HTTPRequest(
                    method: "GET", path: "/providers/orders/token",
                    query: [("audience", nil), ("audience", "https://orders.example")],
                    headers: [("Token-Broker-Request", "true")])
            ).immediate
            expectError(repeated, 400, "invalid_request")
            #expect(repeated?.string("error_description") == "audience is given more than once")
            #expect(template.status().children == 0)
            #expect(shared.count == 0)
        }
    }

    @Test func pastMaxChildrenANewChildIs503WithRetryAfterAndKnownChildrenStillAnswer() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(maxChildren: 1, shared: shared)
        let metrics = BrokerMetrics(version: "test")
        let api = api(templates: [template], metrics: metrics)
        await running([template]) {
            let first = await answer(
                api.handle(token("/providers/orders/token", [("audience", "https://api.example/1")])))
            #expect(first?.status == 200)
            let refused = api.handle(token("/providers/orders/token", [("audience", "https://api.example/2")]))
                .immediate
            // childIdleSec is 3600 and the only child was read moments ago (the exact time is the
            // template's tests', on a manual clock).
            #expect(refused?.status == 503 && refused?.errorCode == "too_many_children")
            #expect((3500...3600).contains(Int(refused?.header("Retry-After") ?? "") ?? 0))
            #expect(refused?.string("error_description")?.contains("at most 1 children (maxChildren)") == true)
            #expect(shared.count == 1)
            let known = api.handle(token("/providers/orders/token", [("audience", "https://api.example/1")])).immediate
            #expect(known?.status == 200)
            #expect(
                metrics.render(statuses: []).contains(
                    #"token_broker_http_requests_total{listener="token",route="/providers/{name}/token",code="503"} 1"#)
            )
        }
    }

    @Test func aFirstWaitThatEndsWithoutATokenIsTheUsual503() async {
        let shared = ValuesSource.Shared(fails: true)
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template], maxWait: .seconds(1))
        await running([template]) {
            let reply = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")]))
            #expect(reply.immediate == nil)
            let response = await answer(reply)
            expectError(response, 503, "token_unavailable", headers: ["Retry-After": "1"])
            #expect(response?.string("error_description")?.contains("unreachable") == true)
        }
    }

    @Test func onceAChildsFirstFetchFailedLaterRequestsGetThe503AtOnce() async {
        let shared = ValuesSource.Shared(fails: true)
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template], maxWait: .seconds(30))
        await running([template]) {
            let first = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")]))
            #expect(first.immediate == nil, "the first request waits for the child's first token")
            guard
                case .success(let lease) = template.child(
                    for: TokenRequestValues(audience: "https://orders.example"))
            else {
                Issue.record("no child")
                return
            }
            let child = lease.held.child
            #expect(await eventually { child.status().lastError != nil })
            let later = api.handle(token("/providers/orders/token", [("audience", "https://orders.example")]))
            expectError(later.immediate, 503, "token_unavailable", headers: ["Retry-After": "1"])
            #expect(later.immediate?.string("error_description")?.contains("unreachable") == true)
        }
    }

    @Test func callerKeysAllowedTheTemplateAreAllowedItsChildren() async {
        let shared = ValuesSource.Shared()
        let template = liveTemplate(shared: shared)
        let api = api(templates: [template], callers: TemplateCallers())
        await running([template]) {
            let query = [("audience", "https://orders.example")]
            let allowed = await answer(
                api.handle(token("/providers/orders/token", query, headers: [("Authorization", "Bearer orders")])))
            #expect(allowed?.status == 200)
            // Refused callers make no child, whatever they ask.
            let other = api.handle(
                token(
                    "/providers/orders/token", [("audience", "https://api.example/x")],
                    headers: [("Authorization", "Bearer other")])
            ).immediate
            expectError(other, 403, "provider_not_allowed")
            expectError(
                api.handle(token("/providers/orders/token", [("audience", "https://api.example/y")])).immediate, 401,
                "missing_caller_key", headers: ["WWW-Authenticate": "Bearer realm=\"token-broker\""])
            #expect(template.status().children == 1 && shared.count == 1)
        }
    }

    @Test func aStoppedTemplateAnswersShuttingDown() {
        let template = liveTemplate(shared: ValuesSource.Shared())
        let api = api(templates: [template])
        template.shutDown()
        expectError(
            api.handle(token("/providers/orders/token", [("audience", "https://orders.example")])).immediate, 503,
            "shutting_down", headers: ["Retry-After": "1"])
    }
}

/// A template seen only through `TemplateProviding`, as the routes see any template.
final class AnyTemplate: TemplateProviding {
    typealias Provider = TokenProvider<ContinuousClock>
    private let template: LiveTemplate

    init(_ template: LiveTemplate) { self.template = template }

    var name: String { template.name }
    var configuration: ProviderConfiguration { template.configuration }
    func status() -> TemplateStatus { template.status() }
    func child(for values: TokenRequestValues) -> Result<
        (lease: TemplateLease<Provider>, held: LeasedChild<Provider>), ChildRefusal
    > {
        template.child(for: values)
    }
    func renew(_ lease: TemplateLease<Provider>) -> LeasedChild<Provider>? { template.renew(lease) }
}
