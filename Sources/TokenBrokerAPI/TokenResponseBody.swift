import TokenBrokerCore

/// The JSON that `/token` answers with, using OAuth 2.0's field names (RFC 6749 §5.1):
///
///     {"access_token":"eyJ…","token_type":"Bearer","expires_in":899,
///      "expires_at":"2026-11-30T00:15:00Z","issued_at":"2026-11-30T00:00:00Z",
///      "version":3,"stale":false,"provider":"default"}
///
/// `expires_in` and `expires_at` are left out for a token without expiry.
public enum TokenResponseBody {
    /// The body of an answer with `cached`.
    ///
    /// - Parameters:
    ///   - expiresIn: the token's `CachedToken.secondsLeft(at:)` when the answer is rendered.
    ///   - cookie: when `setTokenCookie` is on, `cookie` and `set_cookie` are added. A provider
    ///     with `setTokenCookie` accepts only tokens that are cookie values (`TokenRules`); should
    ///     another ever reach here, the two are left out rather than written broken.
    public static func render<Instant>(
        _ cached: CachedToken<Instant>, stale: Bool, expiresIn: Int?, provider: String,
        cookie: CookieSettings = CookieSettings()
    ) -> String {
        var members: [(String, String)] = [
            ("access_token", JSONText.quoted(cached.token.accessToken)),
            ("token_type", JSONText.quoted(cached.token.tokenType)),
        ]
        if let expiresIn { members.append(("expires_in", String(expiresIn))) }
        if let expiresAt = cached.expiresAtDate {
            members.append(("expires_at", JSONText.quoted(RFC3339.string(from: expiresAt))))
        }
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
}
