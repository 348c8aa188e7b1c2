// The token listener's admission of requests under /proxy/: the path rules, the request guard and
// caller keys before any body is read, against proxy mode of the test's making.
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerServer

@testable import TokenBrokerAPI

/// Proxy mode with proxies named in `names` (by default one, `api`), reading `provider` (`default`);
/// it records what reaches it. Its path rules are the test's: the targets in `problems` are
/// refused so, any other is split at its first slash after `/proxy/` (the real rules are
/// `ProxyPath`'s, tested with the proxy).
final class FakeProxy: ProxyHandling {
    let names: Set<String>
    let begun = Mutex<[ProxyRequestTarget]>([])
    let handled = Mutex<[ProxyRequestTarget]>([])
    /// The caller each handled request came with.
    let callers = Mutex<[CallerRecheck?]>([])
    /// How many targets were split and checked.
    let checked = Mutex(0)
    /// The provider every proxy reads.
    let provider: String
    /// With `defers`, the exchanges started: each request waits for the test to answer it.
    let started = Mutex<[any HTTPResponding]>([])
    private let defers: Bool
    init(names: Set<String> = ["api"], provider: String = "default", defers: Bool = false) {
        self.names = names
        self.provider = provider
        self.defers = defers
    }
    static let problems: [String: ProxyPathProblem] = [
        "/proxy/api/a b": .badCharacters, "/proxy/api/../../etc": .escapesRoot, "/proxy/api/a%2Fb": .encodedSeparator,
        "http://evil/proxy/api/": .absoluteForm, "/proxy/": .notUnderProxy,
    ]

    func target(_ rawTarget: String) -> Result<ProxyRequestTarget, ProxyPathProblem> {
        checked.withLock { $0 += 1 }
        if let problem = Self.problems[rawTarget] { return .failure(problem) }
        let rest = rawTarget.dropFirst("/proxy/".count)
        let pathAndQuery = rest.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let name = pathAndQuery[0].prefix { $0 != "/" }
        return .success(
            ProxyRequestTarget(
                proxy: String(name), path: String(pathAndQuery[0].dropFirst(name.count)),
                query: pathAndQuery.count > 1 ? String(pathAndQuery[1]) : nil))
    }

    func provider(ofProxy name: String) -> String? { names.contains(name) ? provider : nil }

    func begin(_ request: HTTPRequest, target: ProxyRequestTarget) -> BodyHandling {
        begun.withLock { $0.append(target) }
        return .buffer(limit: 7)
    }

    func handle(_ request: HTTPRequest, target: ProxyRequestTarget, caller: CallerRecheck?) -> HTTPReply {
        handled.withLock { $0.append(target) }
        callers.withLock { $0.append(caller) }
        guard defers else { return .response(HTTPResponse(status: 202, body: [])) }
        return .deferred { [self] responder in started.withLock { $0.append(responder) } }
    }
}

extension TokenAPI {
    /// `begin` for a request the test does not keep.
    func begin(_ request: HTTPRequest) -> BodyHandling {
        var request = request
        return begin(&request)
    }
}

extension BodyHandling {
    /// The refusal, when the body is refused.
    var refusal: HTTPResponse? {
        if case .refuse(let response) = self { return response }
        return nil
    }

    /// The limit, when the body is to be read whole.
    var bufferLimit: Int?? {
        if case .buffer(let limit) = self { return .some(limit) }
        return nil
    }
}

@Suite struct ProxyRouteTests {
    private func proxied(_ raw: String, method: String = "POST", headers: [(String, String)] = [], guarded: Bool = true)
        -> HTTPRequest
    {
        request(method, String(raw.prefix { $0 != "?" }), headers: headers, rawTarget: raw, guarded: guarded)
    }

    @Test func anAdmittedRequestReachesItsProxy() {
        let proxy = FakeProxy()
        let api = tokenAPI(proxy: proxy)
        #expect(api.begin(proxied("/proxy/api/a/b?x=1")).bufferLimit == .some(7))
        let begun = proxy.begun.withLock { $0 }
        #expect(begun.map(\.proxy) == ["api"] && begun.map(\.path) == ["/a/b"] && begun.map(\.query) == ["x=1"])
        // After `begin`, the guard and the caller are not checked again.
        #expect(api.handle(proxied("/proxy/api/a", guarded: false)).immediate?.status == 202)
        #expect(proxy.handled.withLock { $0.map(\.path) } == ["/a"])
    }

    @Test func handleTakesTheTargetBeginChecked() {
        let proxy = FakeProxy()
        let api = tokenAPI(proxy: proxy)
        var request = proxied("/proxy/api/a/b?x=1")
        #expect(api.begin(&request).bufferLimit == .some(7))
        #expect(api.handle(request).immediate?.status == 202)
        #expect(proxy.handled.withLock { $0 } == [ProxyRequestTarget(proxy: "api", path: "/a/b", query: "x=1")])
        #expect(proxy.checked.withLock { $0 } == 1)
    }

    @Test func aProxyGoneBetweenBeginAndHandleIsUnknown() {
        // A reload between the head and the end of the body may remove the proxy `begin` admitted.
        var request = proxied("/proxy/api/x")
        #expect(tokenAPI(proxy: FakeProxy()).begin(&request).bufferLimit == .some(7))
        let reloaded = FakeProxy(names: ["other"])
        expectError(tokenAPI(proxy: reloaded).handle(request).immediate, 404, "unknown_proxy")
        #expect(reloaded.handled.withLock { $0 }.isEmpty)
    }

    @Test func malformedOrEscapingPathsAre400() {
        let proxy = FakeProxy()
        let api = tokenAPI(proxy: proxy)
        let cases = [
            (
                "/proxy/api/a b",
                "the path or query has characters that are not allowed raw (RFC 3986), or a bad percent-escape"
            ),
            ("/proxy/api/../../etc", "the path climbs above the proxy's base path"),
            ("/proxy/api/a%2Fb", "a path segment hides a slash, backslash, NUL, CR or LF in a percent-escape"),
        ]
        for (raw, description) in cases {
            let refusal = api.begin(proxied(raw)).refusal
            expectError(refusal, 400, "invalid_request")
            #expect(refusal?.string("error_description") == description, "\(raw)")
            expectError(api.handle(proxied(raw)).immediate, 400, "invalid_request")
        }
        expectError(api.begin(proxied("http://evil/proxy/api/")).refusal, 400, "invalid_request")
        expectError(api.begin(proxied("/proxy/")).refusal, 404, "not_found")
        #expect(proxy.begun.withLock { $0 }.isEmpty && proxy.handled.withLock { $0 }.isEmpty)
    }

    @Test func anUnknownProxyIs404() {
        let api = tokenAPI(proxy: FakeProxy())
        let refusal = api.begin(proxied("/proxy/nope/x")).refusal
        expectError(refusal, 404, "unknown_proxy")
        #expect(refusal?.string("error_description") == #"no proxy is named "nope""#)
        expectError(api.handle(proxied("/proxy/nope/x")).immediate, 404, "unknown_proxy")
    }

    /// With no proxy configured at all, `/proxy/{name}/…` is answered as for a name no proxy has:
    /// the caller first, then 404 `unknown_proxy`, not a plain `not_found` to anyone.
    @Test func withoutProxiesTheCallerComesFirstThenUnknownProxy() {
        let api = tokenAPI(callers: FakeCallers())
        expectError(
            api.handle(request("/proxy/ghost/x")).immediate, 401, "missing_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker""#])
        expectError(api.handle(request("/proxy/ghost/x", guarded: false)).immediate, 403, "missing_request_header")
        let known = request("/proxy/ghost/x", headers: [("Authorization", "Bearer good")])
        expectError(api.handle(known).immediate, 404, "unknown_proxy")
        let otherCaller = request("/proxy/ghost/x", headers: [("Authorization", "Bearer billing")])
        expectError(api.handle(otherCaller).immediate, 404, "unknown_proxy")
        // Not a proxy route's form: no name, or no path after it.
        expectError(api.handle(request("/proxy/")).immediate, 404, "not_found")
        expectError(api.handle(request("/proxy/ghost")).immediate, 404, "not_found")
        expectError(tokenAPI().handle(request("/proxy/ghost/x")).immediate, 404, "unknown_proxy")
    }

    @Test func theGuardAndCallerKeysComeBeforeTheBody() {
        let proxy = FakeProxy()
        let api = tokenAPI(callers: FakeCallers(), proxy: proxy)
        expectError(api.begin(proxied("/proxy/api/x", guarded: false)).refusal, 403, "missing_request_header")
        expectError(
            api.begin(proxied("/proxy/api/x", headers: [("X-Forwarded-For", "1")])).refusal, 403, "forwarded_request")
        expectError(
            api.begin(proxied("/proxy/api/x")).refusal, 401, "missing_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker""#])
        expectError(
            api.begin(proxied("/proxy/api/x", headers: [("Authorization", "Bearer billing")])).refusal, 403,
            "provider_not_allowed")
        #expect(proxy.begun.withLock { $0 }.isEmpty)
        #expect(api.begin(proxied("/proxy/api/x", headers: [("Authorization", "Bearer good")])).bufferLimit == .some(7))
    }

    /// The caller `begin` let in reaches the proxy, to be asked again before the request goes
    /// upstream after a wait: a key removed from the file since, or a list that no longer holds
    /// the provider, is refused as a token route's waited request is.
    @Test func theCallerBeginLetInReachesTheProxyToBeCheckedAgain() throws {
        typealias Keys = WaitingCallersTests.Keys
        let keys = try Keys(a: ["default"], b: ["default"])
        let proxy = FakeProxy()
        let api = tokenAPI(callers: keys.store, proxy: proxy)
        func admitted(_ key: (String, String)) -> CallerRecheck? {
            var request = proxied("/proxy/api/x", headers: [key])
            #expect(api.begin(&request).bufferLimit == .some(7))
            #expect(api.handle(request).immediate?.status == 202)
            return proxy.callers.withLock { $0.last ?? nil }
        }
        let a = try #require(admitted(WaitingCallersTests.keyA))
        let b = try #require(admitted(WaitingCallersTests.keyB))
        #expect(a.caller.provider == "default" && a.refusal() == nil && b.refusal() == nil)
        try keys.change(a: nil, b: ["payments"])
        #expect(a.refusal() == .invalidCallerKey)
        #expect(b.refusal() == .providerNotAllowed(caller: "b", provider: "default"))
        try keys.change(a: ["*"], b: ["default"])
        #expect(a.refusal() == nil && b.refusal() == nil)
        // Without keys, no caller is kept.
        let open = FakeProxy()
        var request = proxied("/proxy/api/x")
        #expect(tokenAPI(proxy: open).begin(&request).bufferLimit == .some(7))
        #expect(tokenAPI(proxy: open).handle(request).immediate?.status == 202)
        #expect(open.callers.withLock { $0 }.count == 1 && open.callers.withLock { $0[0] } == nil)
    }

    /// A reload between the head and the end of the body that gives the proxy another provider:
    /// the caller is checked again, against the provider the request would now take a token of.
    @Test func aProxyGivenAnotherProviderBetweenBeginAndHandleChecksTheCallerAgain() throws {
        let keys = try WaitingCallersTests.Keys(a: ["default"], b: ["default", "payments"])
        var a = proxied("/proxy/api/x", headers: [WaitingCallersTests.keyA])
        var b = proxied("/proxy/api/x", headers: [WaitingCallersTests.keyB])
        #expect(tokenAPI(callers: keys.store, proxy: FakeProxy()).begin(&a).bufferLimit == .some(7))
        #expect(tokenAPI(callers: keys.store, proxy: FakeProxy()).begin(&b).bufferLimit == .some(7))
        let reloaded = FakeProxy(provider: "payments")
        let api = tokenAPI(callers: keys.store, proxy: reloaded)
        expectError(api.handle(a).immediate, 403, "provider_not_allowed")
        #expect(api.handle(b).immediate?.status == 202)
        #expect(reloaded.callers.withLock { $0.map { $0?.caller.provider } } == ["payments"])
    }

    @Test func withoutProxiesTheProxyPathIsNotStreamed() {
        let api = tokenAPI()
        #expect(api.begin(request("/proxy/api/x", rawTarget: "/proxy/api/x")).bufferLimit == .some(nil))
    }
}
