// The `/token` body and its cookie line, as rendered for one token.
import Testing

@testable import TokenBrokerAPI
@testable import TokenBrokerCore

@Suite struct TokenResponseBodyTests {
    private let issued = ContinuousClock.now

    private func token(_ accessToken: String = "t", lifetime: Duration?, scope: String? = nil) -> CachedToken<
        ContinuousClock.Instant
    > {
        CachedToken(
            token: FetchedToken(accessToken: accessToken, lifetime: lifetime, scope: scope), version: 3,
            issuedAt: issued,
            expiresAt: lifetime.map { issued.advanced(by: $0) },
            issuedAtDate: WallTime(timeIntervalSince1970: 1_800_000_000))
    }

    @Test func theBodyHasOAuthNamesInOrder() {
        let body = TokenResponseBody.render(
            token(lifetime: .seconds(900), scope: "read"), stale: false, expiresIn: 899, provider: "p")
        #expect(
            body
                == #"{"access_token":"t","token_type":"Bearer","expires_in":899,"expires_at":"2027-01-15T08:15:00Z","#
                + #""issued_at":"2027-01-15T08:00:00Z","scope":"read","version":3,"stale":false,"provider":"p"}"#)
        // Without expiry, neither `expires_in` nor `expires_at`.
        let forever = TokenResponseBody.render(token(lifetime: nil), stale: true, expiresIn: nil, provider: "p")
        #expect(
            forever
                == #"{"access_token":"t","token_type":"Bearer","issued_at":"2027-01-15T08:00:00Z","version":3,"stale":true,"provider":"p"}"#
        )
    }

    /// In its last second, a token's answer says 1 s left, in `expires_in` and in `Max-Age`.
    @Test func inATokensLastSecondTheAnswerSaysOneSecondLeft() {
        let cached = token(lifetime: .seconds(10))
        let lastSecond = issued.advanced(by: .milliseconds(9_400))
        var cookie = CookieSettings()
        cookie.setTokenCookie = true
        let body = TokenResponseBody.render(
            cached, stale: false, expiresIn: cached.secondsLeft(at: lastSecond), provider: "p", cookie: cookie)
        #expect(body.contains(bytes: #""expires_in":1,"#))
        #expect(
            body.contains(
                bytes:
                    #""cookie":"aws-waf-token=t","set_cookie":"aws-waf-token=t; Path=/; Max-Age=1; Secure; HttpOnly; SameSite=Lax"}"#
            ))
    }

    /// A token that is not a cookie value gets no cookie members rather than broken ones.
    @Test func aTokenThatIsNoCookieValueGetsNoCookieLine() {
        var cookie = CookieSettings()
        cookie.setTokenCookie = true
        let body = TokenResponseBody.render(
            token("a;b", lifetime: nil), stale: false, expiresIn: nil, provider: "p", cookie: cookie)
        #expect(!body.contains(bytes: "cookie"))
    }
}
