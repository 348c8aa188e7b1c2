// The token routes over the broker's own provider (TokenProvider), fed by a source of the test's
// making: the honest check that the routes and the provider's read, waiters and retrier fit.
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerTestSupport

@testable import TokenBrokerAPI

/// A source that hands out `tok-1`, `tok-2`, ... and counts its fetches.
final class CountingSource: TokenSource {
    private let fetches = Mutex(0)
    private let lifetime: Duration?

    init(lifetime: Duration? = nil) { self.lifetime = lifetime }

    var count: Int { fetches.withLock { $0 } }

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        let number = fetches.withLock { count in
            count += 1
            return count
        }
        return FetchedToken(accessToken: "tok-\(number)", lifetime: lifetime)
    }
}

@Suite struct LiveProviderRoutesTests {
    /// Runs a provider for the length of `body`, once it holds its first token when refresh runs in the background.
    private func withProvider(
        _ configuration: ProviderConfiguration, source: any TokenSource = CountingSource(),
        _ body: (TokenProvider<ContinuousClock>, TokenAPI<TokenProvider<ContinuousClock>>) async throws -> Void
    ) async throws {
        let provider = TokenProvider(configuration: configuration, source: source)
        let running = Task { await provider.run() }
        defer { running.cancel() }
        if configuration.backgroundRefreshEnabled {
            #expect(await eventually { provider.status().version == 1 })
        }
        let api = TokenAPI(
            providers: [provider], jwks: "{}", maxWait: .seconds(30), metrics: BrokerMetrics(version: "test"))
        try await body(provider, api)
        running.cancel()
        await running.value
    }

    /// Waits (at most 10 s) for a deferred answer.
    private func answer(_ reply: HTTPReply) async -> HTTPResponse? {
        let responder = RecordingResponder()
        guard reply.start(responder) else { return reply.immediate }
        _ = await eventually { !responder.responses.isEmpty }
        return responder.responses.first
    }

    @Test func tokenServesTheCachedTokenWithItsETagAndCookieLine() async throws {
        var cookie = CookieSettings()
        cookie.setTokenCookie = true
        try await withProvider(ProviderConfiguration(cookie: cookie), source: CountingSource(lifetime: .seconds(900))) {
            _, api in
            let response = api.handle(request("/token")).immediate
            #expect(response?.status == 200)
            #expect(
                response?.string("access_token") == "tok-1" && response?.int("version") == 1
                    && response?.bool("stale") == false)
            #expect((899...900).contains(response?.int("expires_in") ?? 0))
            #expect(response?.header("ETag") == "\"1\"")
            #expect(response?.string("cookie") == "aws-waf-token=tok-1")
            #expect(response?.string("set_cookie")?.hasPrefix("aws-waf-token=tok-1; Path=/; Max-Age=") == true)
        }
    }

    @Test func readyAfterTheCurrentVersionIs304WhenNoneComesInTime() async throws {
        try await withProvider(ProviderConfiguration()) { _, api in
            let immediate = api.handle(request("/token/ready", query: [("after", "0")])).immediate
            #expect(immediate?.status == 200 && immediate?.int("version") == 1)
            let reply = api.handle(request("/token/ready", query: [("after", "1"), ("timeout", "0")]))
            #expect(reply.immediate == nil)
            let response = await answer(reply)
            #expect(response?.status == 304 && response?.header("ETag") == "\"1\"" && response?.body.isEmpty == true)
        }
    }

    @Test func refreshBringsTheNextVersion() async throws {
        let source = CountingSource()
        try await withProvider(ProviderConfiguration(), source: source) { _, api in
            let response = await answer(
                api.handle(request("POST", "/token/refresh", body: #"{"rejected_version": 1}"#)))
            #expect(
                response?.status == 200 && response?.int("version") == 2 && response?.string("access_token") == "tok-2")
            #expect(response?.header("ETag") == "\"2\"")
            // An older version than the current one: the current token at once.
            let current = api.handle(request("POST", "/token/refresh", body: #"{"rejected_version": 1}"#)).immediate
            #expect(current?.int("version") == 2)
            #expect(source.count == 2)
        }
    }

    @Test func refreshPastTheWindowIs429() async throws {
        try await withProvider(ProviderConfiguration(forcedRefreshMaxAttempts: 1, forcedRefreshWindowSec: 60)) {
            _, api in
            let first = await answer(api.handle(request("POST", "/token/refresh")))
            #expect(first?.status == 200 && first?.int("version") == 2)
            let second = api.handle(request("POST", "/token/refresh")).immediate
            expectError(
                second, 429, "excessive_refresh", headers: ["Retry-After": second?.header("Retry-After") ?? "?"])
            #expect((1...60).contains(Int(second?.header("Retry-After") ?? "") ?? 0))
            #expect(
                second?.string("error_description")?.hasPrefix(
                    #"provider "default" allows 1 forced refreshes per 60 s; try again in "#) == true)
        }
    }

    /// After the issuer's 429 with Retry-After: 600, the retrier calls it no more: each POST
    /// /token/refresh of the current version is answered at once as a wait that found nothing
    /// newer (its timeout ends before the retry), and none is refused as past the window.
    @Test func refreshInsideTheIssuersRetryAfterCallsNobodyAndUsesNoPlaceInTheWindow() async throws {
        let slowDown = TokenFetchError.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(600))
        let source = ScriptedSource([.token(lifetime: .seconds(900)), .failure(slowDown)])
        try await withProvider(ProviderConfiguration(), source: source) { provider, api in
            _ = provider.forceRefresh(rejected: 1)
            #expect(await eventually { provider.status().lastError != nil })
            #expect(source.fetchCount == 2)
            for _ in 0..<8 {
                let response = await answer(
                    api.handle(request("POST", "/token/refresh", body: #"{"rejected_version": 1}"#)))
                #expect(response?.status == 304 && response?.header("ETag") == "\"1\"")
            }
            #expect(source.fetchCount == 2, "the issuer said to wait 600 s")
        }
    }

    /// Without background refresh and with no retries, the issuer's 429 with Retry-After: 3600
    /// holds for the requests after it: each is answered 503 at once, and only the first fetches.
    @Test func onDemandRequestsInsideTheIssuersRetryAfterFetchNothing() async throws {
        let slowDown = TokenFetchError.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(3600))
        let source = ScriptedSource([.failure(slowDown)])
        try await withProvider(ProviderConfiguration(backgroundRefreshEnabled: false, maxRetryCount: 0), source: source)
        { _, api in
            for _ in 0..<8 {
                let response = await answer(api.handle(request("/token")))
                expectError(response, 503, "token_unavailable", headers: ["Retry-After": "3600"])
            }
            #expect(source.fetchCount == 1, "the issuer said to wait an hour")
        }
    }

    @Test func onDemandEachTokenRequestWaitsForItsOwnFetch() async throws {
        let source = CountingSource()
        try await withProvider(ProviderConfiguration(backgroundRefreshEnabled: false), source: source) { _, api in
            let reply = api.handle(request("/token"))
            #expect(reply.immediate == nil)
            let response = await answer(reply)
            #expect(response?.status == 200 && response?.string("access_token") == "tok-1")
            #expect(source.count == 1)
        }
    }
}
