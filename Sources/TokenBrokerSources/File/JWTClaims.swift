import TokenBrokerCore

/// Reads claims of a JWT without verifying it: the broker hands tokens on, it does not judge them.
public enum JWTClaims {
    /// The `exp` claim of a compact JWS, or nil when the token is not a JWT with one.
    public static func expiry(of token: String) -> WallTime? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64URL.decode(parts[1]),
            case .object(let claims)? = try? JSONValue(parsing: payload), case .number(let exp)? = claims["exp"]
        else { return nil }
        return WallTime(timeIntervalSince1970: exp)
    }

    /// How long the token lives from `now` by its `exp` claim; nil when it is not a JWT with one.
    ///
    /// `exp` is whatever number the token's writer put there (`1e16`, `-1e300`), so it is
    /// checked before it becomes a duration: a token already expired, or one that claims to
    /// live longer than `TokenRules.maximumLifetimeSeconds`, is a `bad_response`.
    public static func lifetime(of token: String, at now: WallTime) throws(TokenFetchError) -> Duration? {
        guard let expiry = expiry(of: token) else { return nil }
        let left = expiry.timeIntervalSince(now)
        guard left > 0 else {
            let when =
                expiry.wholeSecondsSince1970 != nil
                ? "at \(RFC3339.string(from: expiry))" : "(exp \(expiry.timeIntervalSince1970))"
            throw .badResponse("the token expired \(when)")
        }
        guard left <= Double(TokenRules.maximumLifetimeSeconds), let lifetime = Duration.checkedSeconds(left) else {
            throw .badResponse(
                "the token's exp is more than a year away (exp \(expiry.timeIntervalSince1970)); allowed: at most \(TokenRules.maximumLifetimeSeconds) s"
            )
        }
        return lifetime
    }
}
