// With caller keys, one key holds at most half the token listener's places for waiting
// requests: its next wait is refused at once (429 too_many_waiting_for_key), and the other keys'
// waits are not. The listener's own cap (the server's `WaitingPlaces`) is tested with the server;
// its refusal's wording per route is tested here.
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerServer

@testable import TokenBrokerAPI

@Suite struct KeyWaitingPlacesTests {
    typealias Keys = WaitingCallersTests.Keys
    static let keyA = WaitingCallersTests.keyA
    static let keyB = WaitingCallersTests.keyB

    // MARK: The table

    @Test func eachKeyMayHoldHalfTheListenersPlacesAndGivesThemBack() {
        #expect(KeyWaitingPlaces(listenerPlaces: 14_000).limit == 7_000)
        #expect(KeyWaitingPlaces(listenerPlaces: 14).limit == 7)
        #expect(KeyWaitingPlaces(listenerPlaces: 1).limit == 1)
        let places = KeyWaitingPlaces(listenerPlaces: 14)
        let a: [UInt8] = [1, 2, 3]
        let b: [UInt8] = [4, 5, 6]
        for _ in 0..<7 { #expect(places.take(a)) }
        #expect(!places.take(a))
        #expect(places.take(b) && places.holding(b) == 1)
        places.giveBack(a)
        #expect(places.holding(a) == 6 && places.take(a) && !places.take(a))
        for _ in 0..<7 { places.giveBack(a) }
        places.giveBack(b)
        #expect(places.keysWaiting == 0, "a key with nothing waiting is not kept")
        places.giveBack(a)
        #expect(places.holding(a) == 0, "a place never taken is not given back")
    }

    // MARK: The routes

    private func api(_ provider: FakeProvider, _ keys: Keys, places: KeyWaitingPlaces, metrics: BrokerMetrics)
        -> TokenAPI<FakeProvider>
    {
        TokenAPI(
            providers: [provider], jwks: "{}", maxWait: .seconds(30), callers: keys.store, keyPlaces: places,
            metrics: metrics)
    }

    enum Wait: CaseIterable { case longPoll, refresh, onDemand }

    private func asked(_ wait: Wait, _ key: (String, String)) -> HTTPRequest {
        switch wait {
        case .longPoll: request("/token/ready", query: [("after", "1")], headers: [key])
        case .refresh: request("POST", "/token/refresh", headers: [key])
        case .onDemand: request("/token", headers: [key])
        }
    }

    /// Key a fills its half (2 of 4 places) with each kind of wait; its next is refused at once
    /// with 429, registers no waiter, and is counted; key b still waits. A place comes back when
    /// a's wait ends, by a hang-up or an answer, and the table is empty once every wait ended.
    @Test func aKeyHoldingItsHalfIsRefusedAndAnotherKeyStillWaits() throws {
        for wait in Wait.allCases {
            let keys = try Keys(a: ["default"], b: ["default"])
            let provider = FakeProvider()
            if wait == .onDemand { provider.state.withLock { $0.read = .onDemand(cached: nil) } }
            let places = KeyWaitingPlaces(listenerPlaces: 4)
            let metrics = BrokerMetrics(version: "test")
            let api = api(provider, keys, places: places, metrics: metrics)
            func start(_ key: (String, String)) -> RecordingResponder {
                let responder = RecordingResponder()
                #expect(api.handle(asked(wait, key)).start(responder), "\(wait) is deferred")
                return responder
            }
            let a = [start(Self.keyA), start(Self.keyA)]
            #expect(a.allSatisfy { $0.responses.isEmpty }, "\(wait)")
            // A refresh is refused before its forced refresh starts, so at once; the others from `start`.
            let reply = api.handle(asked(wait, Self.keyA))
            let refused = RecordingResponder()
            #expect(reply.start(refused) == (wait != .refresh))
            expectError(
                reply.immediate ?? refused.responses.first, 429, "too_many_waiting_for_key",
                headers: ["Retry-After": "1"])
            #expect(refused.responses.count == (wait == .refresh ? 0 : 1))
            #expect(
                provider.state.withLock { $0.waiters.count } == 2, "\(wait): the refused request registered no waiter")
            let b = [start(Self.keyB), start(Self.keyB)]
            #expect(b.allSatisfy { $0.responses.isEmpty }, "\(wait): the other key's requests wait")
            #expect(provider.state.withLock { $0.waiters.count } == 4)

            a[0].hangUp()
            let again = start(Self.keyA)
            #expect(again.responses.isEmpty, "\(wait): the place a hang-up gave back is taken again")
            provider.completeWaiters(.token(FakeProvider.token(version: 2), stale: false))
            #expect((a[1...] + b + [again]).allSatisfy { $0.responses.first?.status == 200 }, "\(wait)")
            #expect(places.keysWaiting == 0, "\(wait): every place came back")
            let later = start(Self.keyA)
            #expect(later.responses.isEmpty, "\(wait)")

            let text = metrics.render(statuses: [])
            #expect(text.contains(#"token_broker_waits_refused_total{listener="token",limit="caller_key"} 1"#))
            let route = wait == .longPoll ? "/token/ready" : wait == .refresh ? "/token/refresh" : "/token"
            #expect(
                text.contains(#"token_broker_http_requests_total{listener="token",route="\#(route)",code="429"} 1"#))
        }
    }

    /// A refresh the key could not wait for is refused before it starts a forced refresh; one
    /// for a version older than the one held is answered at once with it, as ever.
    @Test func aKeyHoldingItsHalfStartsNoRefresh() throws {
        let keys = try Keys(a: ["default"], b: ["default"])
        let provider = FakeProvider()
        let api = api(provider, keys, places: KeyWaitingPlaces(listenerPlaces: 2), metrics: BrokerMetrics(version: "t"))
        #expect(
            api.handle(request("/token/ready", query: [("after", "1")], headers: [Self.keyA])).start(
                RecordingResponder()))
        let refused = api.handle(request("POST", "/token/refresh", headers: [Self.keyA])).immediate
        expectError(refused, 429, "too_many_waiting_for_key", headers: ["Retry-After": "1"])
        #expect(provider.state.withLock { $0.refreshes.isEmpty }, "no forced refresh was started")

        provider.state.withLock {
            $0.status = FakeProvider.status(name: "default", phase: .fresh, version: 3)
            $0.refresh = .current(FakeProvider.token(version: 3))
        }
        let older = api.handle(
            request("POST", "/token/refresh", headers: [Self.keyA], body: #"{"rejected_version": 1}"#))
        #expect(older.immediate?.status == 200 && older.immediate?.int("version") == 3)
        let current = api.handle(
            request("POST", "/token/refresh", headers: [Self.keyA], body: #"{"rejected_version": 3}"#))
        expectError(current.immediate, 429, "too_many_waiting_for_key", headers: ["Retry-After": "1"])
        #expect(provider.state.withLock { $0.refreshes } == [1])
    }

    /// A proxied request's exchange holds a place of its key's too, until it is answered.
    @Test func aProxiedExchangeHoldsAPlaceOfItsKey() throws {
        let keys = try Keys(a: ["default"], b: ["default"])
        let proxy = FakeProxy(defers: true)
        let places = KeyWaitingPlaces(listenerPlaces: 2)
        let metrics = BrokerMetrics(version: "test")
        let api = TokenAPI(
            providers: [FakeProvider()], jwks: "{}", maxWait: .seconds(30), callers: keys.store, keyPlaces: places,
            proxy: proxy, metrics: metrics)
        func proxied(_ key: (String, String)) -> RecordingResponder {
            var asked = request("POST", "/proxy/api/x", headers: [key], rawTarget: "/proxy/api/x")
            #expect(api.begin(&asked).bufferLimit == .some(7))
            let responder = RecordingResponder()
            #expect(api.handle(asked).start(responder))
            return responder
        }
        let first = proxied(Self.keyA)
        let refused = proxied(Self.keyA)
        expectError(refused.responses.first, 429, "too_many_waiting_for_key", headers: ["Retry-After": "1"])
        #expect(proxy.started.withLock { $0.count } == 1, "the refused exchange never started")
        let other = proxied(Self.keyB)
        #expect(other.responses.isEmpty && proxy.started.withLock { $0.count } == 2)
        proxy.started.withLock { $0[0] }.respond(HTTPResponse(status: 204, body: []))
        #expect(first.responses.first?.status == 204)
        #expect(proxied(Self.keyA).responses.isEmpty, "the answered exchange gave its place back")
        let text = metrics.render(statuses: [])
        #expect(text.contains(#"token_broker_proxy_requests_total{proxy="api",code="429"} 1"#))
        #expect(
            text.contains(#"token_broker_http_requests_total{listener="token",route="/proxy/{name}",code="429"} 1"#))
    }

    /// Without caller keys nobody is told apart: no key's share applies, only the listener's cap.
    @Test func withoutCallerKeysNoShareApplies() {
        let provider = FakeProvider()
        let api = TokenAPI(
            providers: [provider], jwks: "{}", maxWait: .seconds(30), keyPlaces: KeyWaitingPlaces(listenerPlaces: 2),
            metrics: BrokerMetrics(version: "test"))
        for _ in 0..<5 {
            let responder = RecordingResponder()
            #expect(api.handle(request("/token/ready", query: [("after", "1")])).start(responder))
            #expect(responder.responses.isEmpty)
        }
    }

    // MARK: The listener's refusal

    @Test func theListenersRefusalSaysHowManyMayWaitAndWhenToTryAgain() {
        let api = tokenAPI()
        let refusal = api.refusal(.tooManyWaiting(path: "/token/ready", places: 14))
        expectError(refusal, 503, "too_many_waiting", headers: ["Retry-After": "1"])
        #expect(refusal.string("error_description")?.contains("all 14 places") == true)
        let proxied = api.refusal(.tooManyWaiting(path: "/proxy/api/x", places: 14))
        expectError(proxied, 503, "too_many_waiting", headers: ["Retry-After": "1"])
    }
}
