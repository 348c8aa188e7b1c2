// A request that waits (a long-poll, a refresh, a token fetched on demand, a child's first token)
// is checked again against the callers listed when it is answered: a key removed from the keys
// file, or a provider taken off a caller's list, while the request waited gets the refusal a new
// request would get, not a token minted after the change.
import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerTestSupport

@testable import TokenBrokerAPI

extension CallerKeyStore {
    /// `admit(_:provider:)` for a header given as text: its UTF-8.
    fileprivate func admit(_ authorization: String?, provider: String) -> CallerAdmission {
        guard var authorization else { return admit(UnsafeBufferPointer<UInt8>?.none, provider: provider) }
        return authorization.withUTF8 { admit($0, provider: provider) }
    }
}

@Suite struct WaitingCallersTests {
    /// `printf %s key-a | sha256sum` and `printf %s key-b | sha256sum`, computed outside the broker.
    static let hashA = "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4"
    static let hashB = "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634"

    /// A keys file and its store: `a` (key-a) and `b` (key-b), each with the providers given.
    struct Keys {
        let directory: TemporaryDirectory
        let path: String
        let store: CallerKeyStore

        init(a: [String]?, b: [String]?, knownProviders: Set<String> = ["default", "payments"]) throws {
            directory = try TemporaryDirectory()
            path = directory.path("callers.json")
            try Self.write(a: a, b: b, to: path)
            store = try CallerKeyStore(path: path, knownProviders: knownProviders)
        }

        /// Writes a new list (nil: the caller is not listed) and has the store read it, as its
        /// watch does once a second.
        func change(a: [String]?, b: [String]?) throws {
            try Self.write(a: a, b: b, to: path)
            #expect(store.reloadIfChanged() != nil, "the store read the new list")
        }

        static func write(a: [String]?, b: [String]?, to path: String) throws {
            func entry(_ name: String, _ hash: String, _ providers: [String]?) -> String? {
                providers.map { providers in
                    let names = providers.map { "\"\($0)\"" }.joined(separator: ", ")
                    return #"{"name": "\#(name)", "sha256": "\#(hash)", "providers": [\#(names)]}"#
                }
            }
            let entries = [entry("a", WaitingCallersTests.hashA, a), entry("b", WaitingCallersTests.hashB, b)]
            let json = #"{"keys": [\#(entries.compactMap { $0 }.joined(separator: ", "))]}"#
            try Data(json.utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        }
    }

    static let keyA = ("Authorization", "Bearer key-a")
    static let keyB = ("Authorization", "Bearer key-b")
    /// The headers of a 401 `invalid_caller_key`.
    static let invalidKey = ["WWW-Authenticate": #"Bearer realm="token-broker", error="invalid_token""#]

    // MARK: The store

    @Test func aCallerLetInIsCheckedAgainstTheListInForceWhenAsked() throws {
        let keys = try Keys(a: ["default"], b: ["*"])
        guard case .allowed(let a) = keys.store.admit("Bearer key-a", provider: "default") else {
            Issue.record("key-a was not let in")
            return
        }
        #expect(a.provider == "default" && a.keyDigest.count == 32)
        #expect(keys.store.recheck(a) == .allowed)
        // Another caller's change is a new list; the caller is looked up in it, and still may.
        try keys.change(a: ["default"], b: ["payments"])
        #expect(keys.store.recheck(a) == .allowed)
        try keys.change(a: ["payments"], b: ["*"])
        #expect(keys.store.recheck(a) == .forbidden(caller: "a"))
        try keys.change(a: nil, b: ["*"])
        #expect(keys.store.recheck(a) == .unknownKey)
        // Listed again with the same key: the same caller.
        try keys.change(a: ["*"], b: nil)
        #expect(keys.store.recheck(a) == .allowed)
        // A file that does not parse leaves the list, and the answer, as they were.
        try Data(#"{"keys": "#.utf8).write(to: URL(fileURLWithPath: keys.path), options: .atomic)
        guard case .failure = keys.store.reloadIfChanged() else {
            Issue.record("a broken file was accepted")
            return
        }
        #expect(keys.store.recheck(a) == .allowed)
        // A configuration reload reads the file again against the providers it configures.
        try Keys.write(a: ["default"], b: nil, to: keys.path)
        #expect(keys.store.use(knownProviders: ["default"]) == nil)
        #expect(keys.store.recheck(a) == .allowed)
        // What `admit` refuses, `authorize` refuses the same way.
        #expect(keys.store.admit("Bearer key-b", provider: "default") == .refused(.unknownKey))
        #expect(keys.store.admit(nil as String?, provider: "default") == .refused(.missingKey))
    }

    // MARK: The routes

    private func api(_ provider: FakeProvider, _ keys: Keys) -> TokenAPI<FakeProvider> {
        tokenAPI([provider, FakeProvider(name: "payments")], callers: keys.store)
    }

    /// The reviewer's case: key a long-polls, a's key is removed from the file, key b's refresh
    /// makes version 2, and a's long-poll got version 2 (200) from a token minted after its key
    /// was gone. Now it gets 401 `invalid_caller_key`, as a's new requests do.
    @Test func aLongPollWhoseKeyWasRemovedWhileItWaitedIsRefused() throws {
        let keys = try Keys(a: ["default"], b: ["default"])
        let provider = FakeProvider()
        let api = api(provider, keys)
        let responder = RecordingResponder()
        #expect(api.handle(request("/token/ready", query: [("after", "1")], headers: [Self.keyA])).start(responder))
        try keys.change(a: nil, b: ["default"])
        expectError(
            api.handle(request("/token", headers: [Self.keyA])).immediate, 401, "invalid_caller_key",
            headers: Self.invalidKey)
        provider.completeWaiters(.token(FakeProvider.token(version: 2), stale: false))
        expectError(responder.responses.last, 401, "invalid_caller_key", headers: Self.invalidKey)
        #expect(responder.responses.count == 1 && responder.responses.last?.string("access_token") == nil)
    }

    /// Each way a request waits, each outcome that would have carried a token, and a caller whose
    /// list loses the provider (403) besides one whose key is removed (401); a caller whose
    /// entry did not change still gets its answer after another's did.
    @Test func everyWaitIsCheckedWhenItEnds() throws {
        let outcomes: [FakeProvider.Outcome] = [
            .token(FakeProvider.token(version: 2), stale: false),
            .exhausted(previous: FakeProvider.token(version: 1), lastError: nil),
            .timedOut(current: FakeProvider.token(version: 1), lastError: nil),
        ]
        enum Wait: CaseIterable { case longPoll, refresh, onDemand }
        for wait in Wait.allCases {
            for outcome in outcomes {
                for (change, status, code) in [
                    ((a: [String]?.none, b: ["default"]), 401, "invalid_caller_key"),
                    ((a: ["payments"], b: ["default"]), 403, "provider_not_allowed"),
                ] {
                    let keys = try Keys(a: ["default"], b: ["default"])
                    let provider = FakeProvider()
                    if wait == .onDemand { provider.state.withLock { $0.read = .onDemand(cached: nil) } }
                    let api = api(provider, keys)
                    func start(_ key: (String, String)) -> RecordingResponder {
                        let responder = RecordingResponder()
                        let asked =
                            switch wait {
                            case .longPoll: request("/token/ready", query: [("after", "1")], headers: [key])
                            case .refresh: request("POST", "/token/refresh", headers: [key])
                            case .onDemand: request("/token", headers: [key])
                            }
                        #expect(api.handle(asked).start(responder), "\(wait) waits")
                        return responder
                    }
                    let a = start(Self.keyA)
                    let b = start(Self.keyB)
                    try keys.change(a: change.a, b: change.b)
                    provider.completeWaiters(outcome)
                    expectError(a.responses.first, status, code, headers: status == 401 ? Self.invalidKey : [:])
                    #expect(a.responses.count == 1, "\(wait) \(outcome)")
                    if code == "provider_not_allowed" {
                        #expect(a.responses.first?.string("error_description")?.contains("\"a\"") == true)
                    }
                    #expect(b.responses.count == 1 && (b.responses.first.map { $0.status < 400 } ?? false))
                }
            }
        }
    }

    /// A template's new child makes its first request wait for its first token: a caller whose
    /// key is removed meanwhile gets the refusal when the token comes, and the token stays the
    /// child's.
    @Test func aChildsFirstTokenIsNotHandedToACallerRemovedWhileItWaited() async throws {
        let keys = try Keys(a: ["orders"], b: ["orders"], knownProviders: ["orders"])
        let shared = ValuesSource.Shared(gated: true)
        let template = liveTemplate(perRequest: [.audience], shared: shared)
        let api = TokenAPI(
            providers: [], templates: [template], jwks: "{}", maxWait: .seconds(30), callers: keys.store,
            metrics: BrokerMetrics(version: "test"))
        try await running([template]) {
            let responder = RecordingResponder()
            let asked = request(
                "/providers/orders/token", query: [("audience", "https://orders.example")], headers: [Self.keyA])
            #expect(api.handle(asked).start(responder), "a new child's first request waits")
            #expect(await eventually { shared.parked == 1 }, "its first fetch is under way")
            try keys.change(a: nil, b: ["orders"])
            shared.open()
            #expect(await eventually { !responder.responses.isEmpty })
            expectError(responder.responses.first, 401, "invalid_caller_key", headers: Self.invalidKey)
            // The child has its token, which b, still listed, reads.
            let b = api.handle(
                request(
                    "/providers/orders/token", query: [("audience", "https://orders.example")], headers: [Self.keyB]))
            #expect(b.immediate?.status == 200 && b.immediate?.string("access_token")?.hasPrefix("tok-1:") == true)
        }
    }

    /// Without keys, and with a list that did not change, waits are answered as before.
    @Test func aWaitWhoseCallerMayStillReadIsAnswered() throws {
        let keys = try Keys(a: ["default"], b: ["default"])
        let provider = FakeProvider()
        let api = api(provider, keys)
        let responder = RecordingResponder()
        #expect(api.handle(request("/token/ready", query: [("after", "1")], headers: [Self.keyA])).start(responder))
        provider.completeWaiters(.token(FakeProvider.token(version: 2), stale: false))
        #expect(responder.responses.last?.status == 200 && responder.responses.last?.int("version") == 2)
        let open = tokenAPI([provider])
        #expect(open.handle(request("/token/ready", query: [("after", "2")])).start(responder))
        provider.completeWaiters(.token(FakeProvider.token(version: 3), stale: false))
        #expect(responder.responses.last?.status == 200 && responder.responses.last?.int("version") == 3)
    }
}
