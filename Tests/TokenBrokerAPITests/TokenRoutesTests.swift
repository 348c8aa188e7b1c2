// The token listener's routes, run on value requests against a fake provider: routing, methods,
// the request guard, caller keys, /token, /token/ready and /token/refresh.
import Testing
import TokenBrokerServer

@testable import TokenBrokerAPI
@testable import TokenBrokerCore

/// A caller check of the test's making: `Bearer good` may read everything, `Bearer billing` nothing.
struct FakeCallers: FixedCallers {
    func authorize(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerDecision {
        // The bytes as sent, compared as bytes: a string made of them would not be.
        guard let authorization else { return .missingKey }
        if authorization.elementsEqual("Bearer good".utf8) { return .allowed }
        if authorization.elementsEqual("Bearer billing".utf8) { return .forbidden(caller: "billing") }
        return .unknownKey
    }
}

/// A token listener over fake providers (the first is the default).
func tokenAPI(
    _ providers: [FakeProvider] = [FakeProvider()], requestGuard: Bool = true, callers: (any CallerRechecking)? = nil,
    proxy: (any ProxyHandling)? = nil, metrics: BrokerMetrics = BrokerMetrics(version: "test")
) -> TokenAPI<FakeProvider> {
    TokenAPI(
        providers: providers, jwks: #"{"keys":[]}"#, maxWait: .seconds(30), requestGuard: requestGuard,
        callers: callers,
        proxy: proxy, metrics: metrics)
}

@Suite struct TokenRoutesTests {
    // MARK: /token

    @Test func tokenAnswersTheTokenTheReadFoundWithItsETag() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(version: 3), stale: false, secondsLeft: 899) }
        let api = tokenAPI([provider])
        let response = api.handle(request("/token")).immediate
        #expect(response?.status == 200)
        #expect(response?.string("access_token") == "tok-1")
        #expect(response?.string("token_type") == "Bearer")
        #expect(response?.int("expires_in") == 899)
        #expect(response?.int("version") == 3)
        #expect(response?.bool("stale") == false)
        #expect(response?.string("provider") == "default")
        #expect(response?.members["cookie"] == nil)
        #expect(response?.header("ETag") == "\"3\"")
        #expect(response?.header("Content-Type") == "application/json")
        #expect(response?.header("Cache-Control") == "no-store")
        #expect(provider.state.withLock { $0.reads } == [0])
        // HEAD is a read too.
        #expect(api.handle(request("HEAD", "/token")).immediate?.status == 200)
    }

    @Test func tokenAnswerIsBuiltOncePerVersionAndSecond() {
        let provider = FakeProvider()
        let token = FakeProvider.token(version: 1)
        provider.state.withLock { $0.read = .token(token, stale: false, secondsLeft: 899) }
        let api = tokenAPI([provider])
        let first = api.handle(request("/token")).immediate
        let again = api.handle(request("/token")).immediate
        #expect(first != nil && first === again)
        provider.state.withLock { $0.read = .token(token, stale: false, secondsLeft: 898) }
        let nextSecond = api.handle(request("/token")).immediate
        #expect(nextSecond !== first)
        #expect(nextSecond?.int("expires_in") == 898)
    }

    @Test func staleTokenIsFlaggedAndCounted() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(), stale: true, secondsLeft: 10) }
        let metrics = BrokerMetrics(version: "test")
        let response = tokenAPI([provider], metrics: metrics).handle(request("/token")).immediate
        #expect(response?.status == 200)
        #expect(response?.bool("stale") == true)
        let exposition = metrics.render(statuses: [provider.status()])
        #expect(exposition.contains(bytes: #"token_broker_stale_tokens_served_total{provider="default"} 1"#))
    }

    @Test func tokenCarriesTheCookieLineWhenAsked() {
        var cookie = CookieSettings()
        cookie.setTokenCookie = true
        let provider = FakeProvider(cookie: cookie)
        provider.state.withLock { $0.read = .token(FakeProvider.token("abc"), stale: false, secondsLeft: 600) }
        let response = tokenAPI([provider]).handle(request("/token")).immediate
        #expect(response?.string("cookie") == "aws-waf-token=abc")
        #expect(
            response?.string("set_cookie") == "aws-waf-token=abc; Path=/; Max-Age=600; Secure; HttpOnly; SameSite=Lax")
    }

    @Test func tokenWithoutAValidTokenIs503WithRetryAfterAndSaysWhy() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .unavailable(wasPaused: false, awaitingFirstToken: false) }
        expectError(
            tokenAPI([provider]).handle(request("/token")).immediate, 503, "token_unavailable",
            headers: ["Retry-After": "1"])

        // The issuer said 600 s; 6.5 s of them are left, rounded up.
        let limited = TokenFetchError.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(600))
        provider.state.withLock {
            $0.read = .unavailable(wasPaused: true, awaitingFirstToken: false)
            $0.status = FakeProvider.status(name: "default", lastError: limited, heldOffFor: .milliseconds(6500))
        }
        let response = tokenAPI([provider]).handle(request("/token")).immediate
        expectError(response, 503, "token_unavailable", headers: ["Retry-After": "7"])
        let description = response?.string("error_description") ?? ""
        #expect(description.hasPrefix(#"provider "default" has no valid token; last upstream error: "#))
        #expect(
            description.hasSuffix(
                "refresh was paused while idle and has resumed: wait for the new token at /token/ready"))

        // Once the issuer's wait is over, a caller is not told to wait it again.
        provider.state.withLock { $0.status = FakeProvider.status(name: "default", lastError: limited) }
        expectError(
            tokenAPI([provider]).handle(request("/token")).immediate, 503, "token_unavailable",
            headers: ["Retry-After": "1"])
    }

    @Test func tokenOnDemandWaitsForAFetchMadeForIt() {
        let provider = FakeProvider()
        // The last token, still valid, is the proxy's to reuse: `/token` fetches one for each request.
        provider.state.withLock { $0.read = .onDemand(cached: FakeProvider.token(version: 1)) }
        let api = tokenAPI([provider])
        let responder = RecordingResponder()
        #expect(api.handle(request("/token")).start(responder))
        let waiter = provider.onlyWaiter
        #expect(waiter?.waiter.onDemand == true && waiter?.waiter.after == nil && waiter?.waiter.forRefresh == false)
        #expect(responder.responses.isEmpty)
        provider.completeWaiters(.token(FakeProvider.token(version: 2, lifetime: .seconds(60)), stale: false))
        let response = responder.responses.first
        #expect(responder.responses.count == 1)
        #expect(response?.status == 200 && response?.int("version") == 2 && response?.header("ETag") == "\"2\"")
        #expect((1...60).contains(response?.int("expires_in") ?? 0))

        // Retries spent: the previous token, flagged stale; none at all: 503.
        #expect(api.handle(request("/token")).start(responder))
        provider.completeWaiters(.exhausted(previous: FakeProvider.token(version: 1), lastError: .timeout("slow")))
        #expect(responder.responses.last?.bool("stale") == true)
        #expect(api.handle(request("/token")).start(responder))
        provider.completeWaiters(.exhausted(previous: nil, lastError: .timeout("slow")))
        expectError(responder.responses.last, 503, "token_unavailable", headers: ["Retry-After": "1"])
    }

    // MARK: /token/ready

    @Test func readyAnswersAtOnceWhenANewerTokenIsCached() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(version: 2), stale: false, secondsLeft: nil) }
        let response = tokenAPI([provider]).handle(request("/token/ready", query: [("after", "1")])).immediate
        #expect(response?.status == 200 && response?.int("version") == 2)
        #expect(provider.state.withLock { $0.reads } == [1])
    }

    @Test func readyWaitsThenAnswersTheNewToken() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(version: 1), stale: false, secondsLeft: nil) }
        let responder = RecordingResponder()
        #expect(
            tokenAPI([provider]).handle(request("/token/ready", query: [("after", "1"), ("timeout", "5")])).start(
                responder))
        let waiter = provider.onlyWaiter
        #expect(waiter?.waiter.after == 1 && waiter?.waiter.onDemand == false && waiter?.waiter.forRefresh == false)
        provider.completeWaiters(.token(FakeProvider.token("tok-2", version: 2), stale: false))
        #expect(responder.responses.count == 1)
        #expect(responder.responses.first?.status == 200)
        #expect(responder.responses.first?.string("access_token") == "tok-2")
        #expect(responder.responses.first?.header("ETag") == "\"2\"")
    }

    @Test func readyTimedOutIs304WithAfterAndTheTokenWithout() {
        let provider = FakeProvider()
        provider.state.withLock {
            $0.read = .unavailable(wasPaused: false, awaitingFirstToken: false)
            $0.status = FakeProvider.status(name: "default", phase: .backingOff, version: 4, stale: true)
        }
        let api = tokenAPI([provider])
        let responder = RecordingResponder()
        #expect(api.handle(request("/token/ready", query: [("after", "4"), ("timeout", "0")])).start(responder))
        provider.completeWaiters(.timedOut(current: FakeProvider.token(version: 4), lastError: nil))
        let notModified = responder.responses.last
        #expect(notModified?.status == 304 && notModified?.body.isEmpty == true)
        #expect(notModified?.header("ETag") == "\"4\"" && notModified?.header("Cache-Control") == "no-store")

        // Without `after`, the current token, stale as the provider says.
        #expect(api.handle(request("/token/ready", query: [("timeout", "0")])).start(responder))
        provider.completeWaiters(.timedOut(current: FakeProvider.token(version: 4), lastError: nil))
        #expect(responder.responses.last?.status == 200 && responder.responses.last?.bool("stale") == true)

        // No token at all: 503; the broker stopping: 503 shutting_down.
        #expect(api.handle(request("/token/ready")).start(responder))
        provider.completeWaiters(.timedOut(current: nil, lastError: nil))
        expectError(responder.responses.last, 503, "token_unavailable", headers: ["Retry-After": "1"])
        #expect(api.handle(request("/token/ready")).start(responder))
        provider.completeWaiters(.shuttingDown)
        expectError(responder.responses.last, 503, "shutting_down", headers: ["Retry-After": "1"])
    }

    @Test func readyTakesTheVersionFromIfNoneMatch() {
        let provider = FakeProvider()
        let responder = RecordingResponder()
        let api = tokenAPI([provider])
        // A list: the client has each of them, so it waits for one newer than the highest.
        #expect(api.handle(request("/token/ready", headers: [("If-None-Match", #"W/"7", "8""#)])).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 8)
        provider.completeWaiters(.timedOut(current: FakeProvider.token(version: 8), lastError: nil))
        #expect(responder.responses.last?.status == 304)
        #expect(api.handle(request("/token/ready", headers: [("If-None-Match", #""abc", "5""#)])).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 5)
        provider.completeWaiters(.timedOut(current: FakeProvider.token(version: 5), lastError: nil))
        // An entity tag that is not one of ours is no version.
        #expect(api.handle(request("/token/ready", headers: [("If-None-Match", #" "abc" "#)])).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == nil)
        provider.completeWaiters(.timedOut(current: nil, lastError: nil))
        // `*`: whatever version is held now.
        provider.state.withLock { $0.status = FakeProvider.status(name: "default", phase: .fresh, version: 4) }
        #expect(api.handle(request("/token/ready", headers: [("If-None-Match", "*")])).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 4)
        provider.completeWaiters(.timedOut(current: nil, lastError: nil))
        // A higher tag beside `*` is a version the client has too.
        #expect(api.handle(request("/token/ready", headers: [("If-None-Match", #""9", *"#)])).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 9)
    }

    /// A list may be split across header lines (RFC 9110 §5.3): `If-None-Match: "1"` and
    /// `If-None-Match: "2"` are the list `"1", "2"`. Only the first line was read, so a client
    /// holding the current version 2 got it again at once instead of waiting.
    @Test func readyReadsEveryLineOfIfNoneMatchAsOneList() {
        let provider = FakeProvider()
        provider.state.withLock { $0.status = FakeProvider.status(name: "default", phase: .fresh, version: 4) }
        let responder = RecordingResponder()
        let api = tokenAPI([provider])
        let cases: [([String], UInt64?)] = [
            ([#""1""#, #""2""#], 2), ([#""2""#, #""1""#], 2), ([#""1", "3""#, #"W/"2""#], 3),
            ([#""abc""#, #""5""#], 5), (["", #""6""#], 6), ([#""1""#, "*"], 4), (["*", #""7""#], 7),
            ([#""x""#, ""], nil),
        ]
        for (lines, after) in cases {
            let reply = api.handle(request("/token/ready", headers: lines.map { ("If-None-Match", $0) }))
            #expect(reply.start(responder), "\(lines)")
            #expect(provider.onlyWaiter?.waiter.after == after, "\(lines)")
            provider.completeWaiters(.timedOut(current: nil, lastError: nil))
        }
        // `after` in the query still comes first.
        let reply = api.handle(
            request(
                "/token/ready", query: [("after", "1")],
                headers: [("If-None-Match", #""2""#), ("If-None-Match", #""3""#)]))
        #expect(reply.start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 1)
    }

    @Test func aWaiterIsForgottenWhenItsClientHangsUp() {
        let provider = FakeProvider()
        let responder = RecordingResponder()
        #expect(tokenAPI([provider]).handle(request("/token/ready")).start(responder))
        let id = provider.onlyWaiter?.id
        responder.hangUp()
        #expect(id != nil && provider.state.withLock { $0.removed } == [id!])
        #expect(provider.onlyWaiter == nil)
    }

    @Test func badAfterAndTimeoutAre400() {
        let api = tokenAPI()
        let cases: [[(String, String)]] = [
            [("after", "x")], [("after", "-1")], [("after", "")], [("after", "1%00")], [("after", "1234567890123456")],
            [("after", "1"), ("after", "2")], [("timeout", "abc")], [("timeout", "-1")],
            [("timeout", "1"), ("timeout", "1")],
        ]
        for query in cases {
            let response = api.handle(request("/token/ready", query: query)).immediate
            expectError(response, 400, "invalid_request")
        }
        let repeated = api.handle(request("/token/ready", query: [("after", "1"), ("after", "2")])).immediate
        #expect(repeated?.string("error_description") == "after is given more than once")
        // The lookup finds names without regard to case: another spelling is the same parameter again.
        let respelled = api.handle(request("/token/ready", query: [("AFTER", "2"), ("after", "1")])).immediate
        #expect(respelled?.string("error_description") == "after is given more than once")
        let notANumber = api.handle(request("/token/ready", query: [("after", "x")])).immediate
        #expect(notANumber?.string("error_description") == "after must be a whole number from 0, such as after=3")
    }

    @Test func afterOrTimeoutWithoutEqualsSignIs400InAnyOrder() {
        let api = tokenAPI()
        // `?after&after=6` was taken as `after` left out, and `?after=6&after` as given twice;
        // `?timeout&timeout=1` waited the default 30 s.
        let cases: [[(String, String?)]] = [
            [("after", nil)], [("after", nil), ("after", "6")], [("after", "6"), ("after", nil)],
            [("timeout", nil)], [("timeout", nil), ("timeout", "1")], [("after", "1"), ("timeout", nil)],
        ]
        for query in cases {
            let reply = api.handle(
                HTTPRequest(
                    method: "GET", path: "/token/ready", query: query, headers: [("Token-Broker-Request", "true")]))
            expectError(reply.immediate, 400, "invalid_request")
        }
        let leftOut = api.handle(
            HTTPRequest(
                method: "GET", path: "/token/ready", query: [("after", nil)],
                headers: [("Token-Broker-Request", "true")]))
        #expect(
            leftOut.immediate?.string("error_description") == "after must be a whole number from 0, such as after=3")
    }

    // MARK: /token/refresh

    @Test func refreshReadsTheRejectedVersionFromEveryBodyForm() {
        let provider = FakeProvider()
        provider.state.withLock { $0.refresh = .current(FakeProvider.token(version: 9)) }
        let api = tokenAPI([provider])
        let accepted: [(String, UInt64?)] = [
            ("", nil), (" \r\n\t", nil), ("{}", nil), (#"{"rejected_version": 3}"#, 3),
            (#" {"rejected_version":0} "#, 0),
            (#"{"rejected_version": 999999999999999}"#, 999_999_999_999_999),
        ]
        for (body, _) in accepted {
            let response = api.handle(request("POST", "/token/refresh", body: body)).immediate
            #expect(response?.status == 200 && response?.int("version") == 9, "\(body)")
        }
        #expect(provider.state.withLock { $0.refreshes } == accepted.map(\.1))

        let refused = [
            "[]", "3", "{", #"{"rejected_version": -1}"#, #"{"rejected_version": 1.5}"#, #"{"rejected_version": 1e15}"#,
            #"{"rejected_version": "3"}"#, #"{"rejected_version": 3, "other": 1}"#,
        ]
        for body in refused {
            expectError(api.handle(request("POST", "/token/refresh", body: body)).immediate, 400, "invalid_request")
        }
        let unknownKey = api.handle(request("POST", "/token/refresh", body: #"{"other": 1}"#)).immediate
        #expect(
            unknownKey?.string("error_description") == #"unknown key "other" in the body; allowed: rejected_version"#)
        #expect(provider.state.withLock { $0.refreshes.count } == accepted.count)
    }

    @Test func refreshBodyTooLargeIs413() {
        let provider = FakeProvider()
        let response = tokenAPI([provider]).handle(request("POST", "/token/refresh", body: "{", bodyTooLarge: true))
            .immediate
        expectError(response, 413, "payload_too_large")
        #expect(response?.string("error_description") == "the body is larger than the broker accepts")
        #expect(provider.state.withLock { $0.refreshes }.isEmpty)
    }

    @Test func refreshPastTheWindowIs429WithRetryAfter() {
        let provider = FakeProvider()
        provider.state.withLock { $0.refresh = .excessive(retryAfter: .milliseconds(2500)) }
        let metrics = BrokerMetrics(version: "test")
        let response = tokenAPI([provider], metrics: metrics).handle(request("POST", "/token/refresh")).immediate
        expectError(response, 429, "excessive_refresh", headers: ["Retry-After": "3"])
        #expect(
            response?.string("error_description")
                == #"provider "default" allows 5 forced refreshes per 30 s; try again in 3 s"#)
        #expect(
            metrics.render(statuses: []).contains(
                bytes: #"token_broker_excessive_refreshes_total{provider="default"} 1"#))
    }

    @Test func refreshWaitsForTheNewTokenAnd304sWhenNoneCame() {
        let provider = FakeProvider()
        provider.state.withLock { $0.refresh = .refreshing(after: 4) }
        let api = tokenAPI([provider])
        let responder = RecordingResponder()
        #expect(api.handle(request("POST", "/token/refresh", body: #"{"rejected_version": 3}"#)).start(responder))
        let waiter = provider.onlyWaiter?.waiter
        #expect(waiter?.after == 4 && waiter?.forRefresh == true && waiter?.onDemand == false)
        provider.completeWaiters(.timedOut(current: FakeProvider.token(version: 4), lastError: nil))
        #expect(responder.responses.last?.status == 304 && responder.responses.last?.header("ETag") == "\"4\"")

        // `after` nil: the rejected version is what the wait is newer than; a token ends it.
        provider.state.withLock { $0.refresh = .refreshing(after: nil) }
        #expect(api.handle(request("POST", "/token/refresh", body: #"{"rejected_version": 5}"#)).start(responder))
        #expect(provider.onlyWaiter?.waiter.after == 5)
        provider.completeWaiters(.token(FakeProvider.token(version: 6), stale: false))
        #expect(responder.responses.last?.status == 200 && responder.responses.last?.int("version") == 6)
    }

    /// An older rejected version gets the current token at once; a stale one is counted as
    /// every stale answer is.
    @Test func refreshOfAnOlderVersionAnswersTheCurrentTokenAndCountsItWhenStale() {
        let provider = FakeProvider()
        provider.state.withLock {
            $0.refresh = .current(FakeProvider.token(version: 4))
            $0.status = FakeProvider.status(name: "default", phase: .backingOff, version: 4, stale: true)
        }
        let metrics = BrokerMetrics(version: "test")
        let response = tokenAPI([provider], metrics: metrics).handle(
            request("POST", "/token/refresh", body: #"{"rejected_version": 2}"#)
        ).immediate
        #expect(response?.status == 200 && response?.int("version") == 4 && response?.bool("stale") == true)
        #expect(
            metrics.render(statuses: []).contains(
                bytes: #"token_broker_stale_tokens_served_total{provider="default"} 1"#))
    }

    @Test func refreshRefusesATimeoutOfZero() {
        let response = tokenAPI().handle(request("POST", "/token/refresh", query: [("timeout", "0")])).immediate
        expectError(response, 400, "invalid_request")
        #expect(
            response?.string("error_description")
                == "timeout must be a whole number of seconds from 1, such as timeout=30")
    }

    // MARK: Routing

    @Test func providersAreReachedByName() {
        let first = FakeProvider(name: "default")
        let second = FakeProvider(name: "payments")
        second.state.withLock {
            $0.read = .token(FakeProvider.token("pay", version: 5), stale: false, secondsLeft: nil)
        }
        let api = tokenAPI([first, second])
        let named = api.handle(request("/providers/payments/token")).immediate
        #expect(
            named?.status == 200 && named?.string("access_token") == "pay" && named?.string("provider") == "payments")
        #expect(first.state.withLock { $0.reads }.isEmpty)
        #expect(api.handle(request("POST", "/providers/payments/token/refresh")).start(RecordingResponder()))
        #expect(second.state.withLock { $0.refreshes } == [nil])
        #expect(
            api.handle(request("/providers/payments/token/ready", query: [("after", "5")])).start(RecordingResponder()))
        #expect(second.state.withLock { $0.waiters.count } == 2)

        let unknown = api.handle(request("/providers/nope/token")).immediate
        expectError(unknown, 404, "unknown_provider")
        #expect(unknown?.string("error_description") == #"no provider is named "nope""#)
        expectError(api.handle(request("/providers/payments")).immediate, 404, "not_found")
        expectError(api.handle(request("/providers/payments/other")).immediate, 404, "not_found")
    }

    @Test func jwksIsPublishedForReadsOnly() {
        let api = tokenAPI()
        let response = api.handle(request("/.well-known/jwks.json", guarded: false)).immediate
        #expect(response?.status == 200 && response?.bodyText == #"{"keys":[]}"#)
        #expect(response?.header("Cache-Control") == "public, max-age=300")
        expectError(
            api.handle(request("POST", "/.well-known/jwks.json")).immediate, 405, "method_not_allowed",
            headers: ["Allow": "GET, HEAD"])
    }

    @Test func unknownPathsAre404AndWrongMethods405() {
        let api = tokenAPI()
        let missing = api.handle(request("/nope")).immediate
        expectError(missing, 404, "not_found")
        #expect(missing?.string("error_description") == "no route for /nope")
        for method in ["POST", "PUT", "DELETE"] {
            expectError(
                api.handle(request(method, "/token")).immediate, 405, "method_not_allowed",
                headers: ["Allow": "GET, HEAD"])
            expectError(
                api.handle(request(method, "/token/ready")).immediate, 405, "method_not_allowed",
                headers: ["Allow": "GET, HEAD"])
        }
        let get = api.handle(request("GET", "/token/refresh")).immediate
        expectError(get, 405, "method_not_allowed", headers: ["Allow": "POST"])
        #expect(get?.string("error_description") == "GET is not allowed here; allowed: POST")
    }

    @Test func absoluteFormTargetsAreRefused() {
        let response = tokenAPI().handle(request("http://example.com/token")).immediate
        expectError(response, 400, "invalid_request")
        #expect(
            response?.string("error_description")
                == "request targets must be paths (origin form); absolute URLs are refused")
    }

    // MARK: Who may ask

    @Test func theRequestGuardWantsItsHeaderAndRefusesRelayedRequests() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(), stale: false, secondsLeft: nil) }
        let api = tokenAPI([provider])
        for path in ["/token", "/token/ready", "/providers/default/token"] {
            expectError(api.handle(request(path, guarded: false)).immediate, 403, "missing_request_header")
            expectError(
                api.handle(request(path, headers: [("token-broker-request", "yes")], guarded: false)).immediate, 403,
                "missing_request_header")
            expectError(
                api.handle(request(path, headers: [("X-Forwarded-For", "10.0.0.1")])).immediate, 403,
                "forwarded_request")
        }
        expectError(
            api.handle(request("POST", "/token/refresh", guarded: false)).immediate, 403, "missing_request_header")
        // Header names in any case.
        #expect(
            api.handle(request("/token", headers: [("TOKEN-BROKER-REQUEST", "true")], guarded: false)).immediate?.status
                == 200)
        #expect(provider.state.withLock { $0.reads }.count == 1)
        // Turned off, neither is asked for.
        #expect(
            tokenAPI([provider], requestGuard: false).handle(
                request("/token", headers: [("X-Forwarded-For", "1")], guarded: false)
            ).immediate?.status == 200)
    }

    /// RFC 7239's `Forwarded` marks a relayed request as `X-Forwarded-For` does: refused the
    /// same way, its name in any case, wherever it stands among the headers, even empty.
    @Test func theRequestGuardRefusesForwardedAsXForwardedFor() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(), stale: false, secondsLeft: nil) }
        let api = tokenAPI([provider])
        for path in ["/token", "/token/ready", "/providers/default/token"] {
            for name in ["Forwarded", "forwarded", "FORWARDED"] {
                expectError(
                    api.handle(request(path, headers: [(name, "for=203.0.113.9")])).immediate, 403,
                    "forwarded_request")
            }
            // Before the guard's own header, and with an empty value.
            expectError(
                api.handle(request(path, headers: [("Forwarded", "")], guarded: false)).immediate, 403,
                "forwarded_request")
        }
        expectError(
            api.handle(request("POST", "/token/refresh", headers: [("Forwarded", "for=192.0.2.60;proto=http")]))
                .immediate, 403, "forwarded_request")
        #expect(provider.state.withLock { $0.reads }.isEmpty)
        // Names that only begin or end like it are not it.
        for name in ["Forwarded-Host", "X-Forwarded", "Forwarde"] {
            #expect(api.handle(request("/token", headers: [(name, "x")])).immediate?.status == 200, "\(name)")
        }
        #expect(
            tokenAPI([provider], requestGuard: false).handle(
                request("/token", headers: [("Forwarded", "for=203.0.113.9")], guarded: false)
            ).immediate?.status == 200)
    }

    @Test func callerKeysAreChecked() {
        let provider = FakeProvider()
        provider.state.withLock { $0.read = .token(FakeProvider.token(), stale: false, secondsLeft: nil) }
        let api = tokenAPI([provider], callers: FakeCallers())
        expectError(
            api.handle(request("/token")).immediate, 401, "missing_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker""#])
        expectError(
            api.handle(request("/token", headers: [("Authorization", "Bearer nobody")])).immediate, 401,
            "invalid_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker", error="invalid_token""#])
        let forbidden = api.handle(request("POST", "/token/refresh", headers: [("authorization", "Bearer billing")]))
            .immediate
        expectError(forbidden, 403, "provider_not_allowed")
        #expect(forbidden?.string("error_description") == #"caller "billing" may not read provider "default""#)
        #expect(api.handle(request("/token", headers: [("Authorization", "Bearer good")])).immediate?.status == 200)
        // The guard comes first.
        expectError(api.handle(request("/token", guarded: false)).immediate, 403, "missing_request_header")
        #expect(provider.state.withLock { $0.refreshes }.isEmpty)
    }

    // MARK: The server's refusals

    @Test func serverRefusalsAreWordedByBothListeners() {
        let handlers: [any HTTPHandler] = [
            tokenAPI(), AdminAPI(providers: [FakeProvider()], metrics: BrokerMetrics(version: "t")),
        ]
        for handler in handlers {
            let malformed = handler.refusal(.malformedHead("two Content-Length headers"))
            expectError(malformed, 400, "invalid_request", headers: ["Connection": "close"])
            #expect(malformed.string("error_description") == "two Content-Length headers")
            expectError(
                handler.refusal(.stopping), 503, "shutting_down", headers: ["Retry-After": "1", "Connection": "close"])
            expectError(handler.refusal(.stopped), 503, "shutting_down", headers: ["Retry-After": "1"])
            let closed = handler.refusal(.clientClosed)
            expectError(closed, 503, "client_closed")
            #expect(closed.string("error_description") == "the client closed the connection")
        }
    }
}
