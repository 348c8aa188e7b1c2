/// The JSON that `/token` answers with, using OAuth 2.0's field names (RFC 6749 §5.1):
///
///     {"access_token":"eyJ…","token_type":"Bearer","expires_in":899,
///      "expires_at":"2026-11-30T00:15:00Z","issued_at":"2026-11-30T00:00:00Z",
///      "version":3,"stale":false,"provider":"default"}
///
/// `expires_in` and `expires_at` are left out for a token without expiry.
public enum TokenResponseBody {
    /// - Parameter cookie: when `setTokenCookie` is on, `cookie` and `set_cookie` are added. A
    ///   provider with `setTokenCookie` accepts only tokens that are cookie values (`TokenRules`);
    ///   should another ever reach here, the two are left out rather than written broken.
    public static func render<Instant>(
        _ cached: CachedToken<Instant>, stale: Bool, expiresIn: Int?, provider: String, cookie: CookieSettings = CookieSettings()
    ) -> String {
        var members: [(String, String)] = [
            ("access_token", JSONText.quoted(cached.token.accessToken)),
            ("token_type", JSONText.quoted(cached.token.tokenType)),
        ]
        if let expiresIn { members.append(("expires_in", String(expiresIn))) }
        if let expiresAt = cached.expiresAtDate { members.append(("expires_at", JSONText.quoted(RFC3339.string(from: expiresAt)))) }
        members.append(("issued_at", JSONText.quoted(RFC3339.string(from: cached.issuedAtDate))))
        if let scope = cached.token.scope { members.append(("scope", JSONText.quoted(scope))) }
        members.append(("version", String(cached.version)))
        members.append(("stale", stale ? "true" : "false"))
        members.append(("provider", JSONText.quoted(provider)))
        if cookie.setTokenCookie, let header = cookie.cookieHeader(token: cached.token.accessToken),
            let line = cookie.setCookieHeader(token: cached.token.accessToken, maxAge: expiresIn)
        {
            members.append(("cookie", JSONText.quoted(header)))
            members.append(("set_cookie", JSONText.quoted(line)))
        }
        return JSONText.object(members)
    }

    /// Whole seconds from `now` until the token expires (`expiresIn(_:)`); nil without expiry.
    public static func secondsLeft<Instant>(_ cached: CachedToken<Instant>, at now: Instant) -> Int? {
        guard let expiresAt = cached.expiresAt else { return nil }
        return expiresIn(now.duration(to: expiresAt))
    }

    /// `expires_in` and `Max-Age` for a token with `left` to live: whole seconds, a fraction
    /// counted as a whole second (0.3 s reads 1), so that a token that is still valid never
    /// reads 0, which would say it has expired. 0 once `left` is not positive: a provider hands
    /// a token out only while `now < expiresAt` (`CachedToken.isValid`), so it then has none.
    public static func expiresIn(_ left: Duration) -> Int {
        left > .zero ? Int(clamping: left.secondsRoundedUp) : 0
    }
}
