/// A JWS algorithm the broker signs with (RFC 7518 §3.1): the `alg` of its tokens and assertions.
///
/// The raw value is the name as configured and as written in a JWS header.
public enum JWSAlgorithm: String, Sendable, CaseIterable, CustomStringConvertible {
    /// ECDSA on the P-256 curve with SHA-256.
    case es256 = "ES256"
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    case rs256 = "RS256"
    /// HMAC with SHA-256.
    case hs256 = "HS256"

    /// The name, such as `ES256`.
    public var description: String { rawValue }
}
