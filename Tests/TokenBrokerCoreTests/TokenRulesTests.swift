import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// The rules every fetched token meets before a provider accepts it, and the values that reach
/// headers: cookies, `token_type`, `expires_in`.
@Suite struct TokenRulesTests {
    private func failure(_ token: FetchedToken, cookie: Bool = false) -> TokenFetchError? {
        do {
            _ = try TokenRules(cookieSafe: cookie).checked(token)
            return nil
        } catch {
            return error
        }
    }

    @Test func anOrdinaryTokenPasses() throws {
        let token = FetchedToken(accessToken: "eyJ.abc-_~+/=.sig", lifetime: .seconds(900))
        #expect(try TokenRules(cookieSafe: true).checked(token) == token)
        #expect(failure(FetchedToken(accessToken: "t", lifetime: nil)) == nil, "no expiry is allowed")
        #expect(
            failure(FetchedToken(accessToken: "t", lifetime: .seconds(31_536_000))) == nil, "exactly a year is allowed")
        #expect(failure(FetchedToken(accessToken: String(repeating: "a", count: 16 * 1024), lifetime: nil)) == nil)
    }

    @Test(arguments: [
        "", "a b", "a\tb", "tab\u{0}nul", "del\u{7F}", "caf\u{E9}", "line\r\nX-Injected: 1",
        String(repeating: "a", count: 16 * 1024 + 1),
        String(repeating: "a", count: 64 * 1024),
    ])
    func tokensThatCannotTravelInAHeaderAreBadResponses(_ value: String) {
        let error = failure(FetchedToken(accessToken: value, lifetime: .seconds(60)))
        #expect(error?.description == "bad_response")
        #expect(error?.detail.contains(bytes: value) != true || value.isEmpty, "the token is never echoed")
    }

    @Test(arguments: [Duration.zero, .seconds(-5), .seconds(31_536_001), .seconds(100 * 31_536_000)])
    func lifetimesOfNothingOrBeyondAYearAreBadResponses(_ lifetime: Duration) {
        #expect(failure(FetchedToken(accessToken: "t", lifetime: lifetime))?.description == "bad_response")
    }

    /// RFC 6749 §3.3: scope-tokens of NQCHAR (`%x21 / %x23-5B / %x5D-7E`) separated by single
    /// spaces, checked over every byte against that grammar written out as ranges; at most 16 KiB.
    @Test func aGrantedScopeIsRFC6749ScopeTokensOfAtMostSixteenKiB() {
        for byte in UInt8(0)...UInt8(127) {
            let scope = "read w" + String(UnicodeScalar(byte)) + "rite"
            let nqchar = byte == 0x21 || (0x23...0x5B).contains(byte) || (0x5D...0x7E).contains(byte)
            #expect(TokenRules.isScope(scope) == (nqchar || byte == 0x20), "byte \(byte)")
        }
        for good in [
            "", "read", "read write", "urn:example:a https://api.example/x?y=1",
            String(repeating: "a", count: 16 * 1024),
        ] {
            #expect(failure(FetchedToken(accessToken: "t", lifetime: nil, scope: good)) == nil, "\(good.prefix(40))")
        }
        for bad in [
            " read", "read ", "read  write", " ", "r\u{202E}ead", "read\u{7}", "caf\u{E9}", "a\"b", "a\\b", "a\tb",
            String(repeating: "a", count: 16 * 1024 + 1), String(repeating: "read ", count: 200_000) + "x",
        ] {
            let error = failure(FetchedToken(accessToken: "t", lifetime: nil, scope: bad))
            #expect(error?.description == "bad_response", "\(bad.prefix(40))")
        }
    }

    /// RFC 6265 §4.1.1: cookie-octet = %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E, checked
    /// over every byte against that grammar written out as ranges.
    @Test func cookieValuesAreExactlyRFC6265CookieOctets() {
        let allowed: [ClosedRange<UInt8>] = [0x21...0x21, 0x23...0x2B, 0x2D...0x3A, 0x3C...0x5B, 0x5D...0x7E]
        for byte in UInt8(0)...0x7F {
            let text = "a" + String(UnicodeScalar(byte)) + "b"
            #expect(TokenRules.isCookieValue(text) == allowed.contains { $0.contains(byte) }, "byte \(byte)")
        }
        #expect(!TokenRules.isCookieValue(""))
        #expect(!TokenRules.isCookieValue("caf\u{E9}"))
    }

    @Test(arguments: ["abc;Domain=evil.example;Max-Age=99999999", "tok;admin=1", "a,b", "a\"b", "a\\b"])
    func withCookiesOnATokenThatIsNoCookieValueIsRefused(_ value: String) {
        let token = FetchedToken(accessToken: value, lifetime: .seconds(60))
        #expect(failure(token) == nil, "visible ASCII is a fine token without cookies")
        #expect(failure(token, cookie: true)?.description == "bad_response")
        var settings = CookieSettings()
        settings.setTokenCookie = true
        #expect(settings.cookieHeader(token: value) == nil)
        #expect(settings.setCookieHeader(token: value, maxAge: 60) == nil)
    }

    @Test func theRulesFollowTheProvidersCookieSetting() {
        var configuration = ProviderConfiguration()
        #expect(TokenRules(for: configuration) == TokenRules(cookieSafe: false))
        configuration.cookie.setTokenCookie = true
        #expect(TokenRules(for: configuration) == TokenRules(cookieSafe: true))
    }

    // MARK: - token_type

    @Test(arguments: [
        ("bearer", "Bearer"), ("BEARER", "Bearer"), ("Bearer", "Bearer"), ("dpop", "DPoP"), ("n_a", "N_A"),
        ("pop", "PoP"),
        ("Example-Type.v2_x", "example-type.v2_x"),
    ])
    func tokenTypesAreCaseInsensitiveAndServedNormalised(_ sent: String, _ served: String) {
        #expect(TokenType.normalised(sent) == served)
        #expect(FetchedToken(accessToken: "t", tokenType: sent, lifetime: nil).tokenType == served)
    }

    @Test(arguments: [
        "", "Bearer\r\nX-Injected: 1", "Bearer\u{0}", "Bear er", "urn:example:type", "https://vendor.example/type",
        "b~x", "a+b", "a/b",
        "B\u{300}", String(repeating: "\u{301}", count: 2000), "B" + String(repeating: "\u{301}", count: 2000),
        String(repeating: "a", count: 65),
        "Beárer",
    ])
    func tokenTypesThatAreNoRFC6749NameAreRefused(_ sent: String) {
        #expect(TokenType.normalised(sent) == nil)
        #expect(failure(FetchedToken(accessToken: "t", tokenType: sent, lifetime: nil))?.description == "bad_response")
    }

    // MARK: - expires_in

    @Test func expiresInRoundsUpSoThatAValidTokenNeverReadsZero() {
        #expect(Duration.milliseconds(1).secondsLeft == 1)
        #expect(Duration.milliseconds(999).secondsLeft == 1)
        #expect(Duration.seconds(1).secondsLeft == 1)
        #expect(Duration.milliseconds(1001).secondsLeft == 2)
        #expect(Duration.seconds(900).secondsLeft == 900)
        #expect(Duration.zero.secondsLeft == 0)
        #expect(Duration.seconds(-3).secondsLeft == 0)
    }

    /// In its last second, a token has 1 s left, and the provider's own read (the cache key of
    /// its answer, and its `expires_in`; `TokenResponseBodyTests` renders it) agrees.
    @Test func inATokensLastSecondTheReadSaysOneSecondLeft() throws {
        let clock = ManualClock()
        let start = clock.now
        var machine = ProviderStateMachine<ManualClock.Instant>(
            configuration: ProviderConfiguration(), now: start, jitter: .fixed(0.5))
        _ = machine.start(now: start)
        _ = machine.fetchSucceeded(
            FetchedToken(accessToken: "t", lifetime: .seconds(10)), now: start,
            wallTime: WallTime(timeIntervalSince1970: 1_800_000_000))
        let lastSecond = start.advanced(by: .milliseconds(9_400))
        let cached = try #require(machine.validToken(at: lastSecond))
        #expect(cached.secondsLeft(at: lastSecond) == 1)
        guard case .token(_, _, let secondsLeft) = machine.read(now: lastSecond).read else {
            Issue.record("the provider should serve its token in its last second")
            return
        }
        #expect(secondsLeft == 1)
        #expect(machine.validToken(at: start.advanced(by: .seconds(10))) == nil, "at its expiry it is no longer served")
    }

    // MARK: - Through a provider

    /// A provider refuses a token that breaks a rule, whatever its source: the previous token
    /// stays, and the failure is a `bad_response`.
    @Test func aProviderKeepsItsPreviousTokenWhenTheNextBreaksARule() async {
        let source = ListSource([
            FetchedToken(accessToken: "good", lifetime: .seconds(900)),
            FetchedToken(accessToken: "tok;admin=1", lifetime: .seconds(900)),
        ])
        var configuration = ProviderConfiguration()
        configuration.cookie.setTokenCookie = true
        let provider = TokenProvider(
            configuration: configuration, source: source, clock: ManualClock(), jitter: .fixed(0.5))
        let service = Task { await provider.run() }
        defer { service.cancel() }
        #expect(await eventually { provider.status().version == 1 })
        _ = provider.forceRefresh(rejected: 1)
        #expect(await eventually { provider.status().lastError != nil })
        let status = provider.status()
        #expect(status.lastError?.description == "bad_response")
        guard case .token(let token, _, _) = provider.read() else {
            Issue.record("the previous token should still be served")
            return
        }
        #expect(status.version == 1 && token.token.accessToken == "good")
        #expect(source.fetches >= 2)
    }
}

/// Hands out the given tokens in order, the last one again and again.
private final class ListSource: TokenSource {
    private let state: Lock<(tokens: [FetchedToken], fetches: Int)>
    init(_ tokens: [FetchedToken]) { state = Lock((tokens, 0)) }
    var fetches: Int { state.withLock { $0.fetches } }

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        state.withLock { state in
            state.fetches += 1
            return state.tokens.count > 1 ? state.tokens.removeFirst() : state.tokens[0]
        }
    }
}
