import TokenBrokerCore

/// Reads claims of a JWT without verifying it: the broker hands tokens on, it does not judge them.
public enum JWTClaims {
    /// The `exp` claim of a token that is a JWT; nil for a token that is not one (an opaque
    /// token) or a JWT without `exp`.
    ///
    /// A token is taken for a JWT when it is three dot-separated parts and the first decodes
    /// (base64url) to text that opens a JSON object, as every JWS header does, in whatever
    /// encoding a reader would take it (`opensAnObject(_:)`), and however leniently: a reader
    /// that skips bytes outside the alphabet (a stray `*` or `~`) decodes such a header too.
    /// Such a token must then be one: its header strict base64url, its header and claims strict
    /// JSON objects, and its `exp`, when there, a NumericDate (RFC 7519
    /// §2: a JSON number). A claim set with a repeated member (two `exp`, which RFC 7519 §4 lets a
    /// reader refuse or read as the last, so that readers disagree), an `exp` that is a string or
    /// null, or claims that are not JSON are a `bad_response`: such a token is never served as if
    /// it had no expiry, nor with a lifetime of the source's default.
    public static func expiry(of token: String) throws(TokenFetchError) -> WallTime? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        // Decoded leniently only when it is not strict base64url (the same bytes when it is).
        let strict = Base64URL.decode(parts[0])
        guard let read = strict ?? Base64URL.decode(parts[0], skippingOthers: true), opensAnObject(read) else {
            return nil
        }
        guard let header = strict else { throw .badResponse("the token is a JWT whose header is not base64url") }
        guard case .object? = try? JSONValue(parsing: header) else {
            throw .badResponse("the token is a JWT whose header is not a JSON object")
        }
        guard let payload = Base64URL.decode(parts[1]) else {
            throw .badResponse("the token is a JWT whose claims are not base64url")
        }
        let parsed: JSONValue
        do throws(JSONParseError) {
            parsed = try JSONValue(parsing: payload)
        } catch {
            // The parser's words name a repeated claim; the name is the token's, so it is cut to
            // printable ASCII.
            throw .badResponse(
                "the token is a JWT whose claims are not JSON (\(TokenEndpointAnswer.issuerText(error.description, [], limit: 80)))"
            )
        }
        guard case .object(let claims) = parsed else {
            throw .badResponse("the token is a JWT whose claims are not a JSON object")
        }
        switch claims["exp"] {
        case nil: return nil
        case .number(let exp)?: return WallTime(timeIntervalSince1970: exp.value)
        case let other?: throw .badResponse("the token is a JWT whose exp is \(other.typeName), not a NumericDate")
        }
    }

    /// Whether a header's bytes open a JSON object as some reader would take them: after white
    /// space, `{`; also after a byte order mark or with NULs around it (`{` in UTF-16 or UTF-32),
    /// which RFC 7515 does not allow but readers such as PyJWT decode, so that a token whose
    /// header is written so is a JWT to them, and must not be served as an opaque token here.
    static func opensAnObject(_ header: [UInt8]) -> Bool {
        let marks: [[UInt8]] = [[0xEF, 0xBB, 0xBF], [0x00, 0x00, 0xFE, 0xFF], [0xFE, 0xFF], [0xFF, 0xFE]]
        let text = marks.first(where: header.starts(with:)).map { header.dropFirst($0.count) } ?? header[...]
        return text.first(where: { ![0x20, 0x09, 0x0A, 0x0D, 0x00].contains($0) }) == UInt8(ascii: "{")
    }

    /// How long the token lives from `now` by its `exp` claim; nil when it is not a JWT with one.
    ///
    /// `exp` is whatever number the token's writer put there (`1e16`, `-1e300`), so it is
    /// checked before it becomes a duration: a token already expired, or one that claims to
    /// live longer than `TokenRules.maximumLifetimeSeconds`, is a `bad_response`, as is a token
    /// that looks like a JWT but is not one (`expiry(of:)`).
    public static func lifetime(of token: String, at now: WallTime) throws(TokenFetchError) -> Duration? {
        guard let expiry = try expiry(of: token) else { return nil }
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
