import TokenBrokerCore
import TokenBrokerCrypto

/// The local signer (`source.type: "jwt"`): mints JWTs itself, in ES256, RS256 or HS256.
///
/// This is the embedded default: with no configuration, the broker issues its own tokens and
/// publishes the public key at `/.well-known/jwks.json` so consumers can verify them.
public struct JWTSigner: TokenSource {
    public let configuration: JWTSourceConfiguration
    public let key: SigningKey
    /// The `kid` of every token and of the published key.
    public let keyID: String

    /// Loads the configured key file, or generates a key when there is none.
    public init(configuration: JWTSourceConfiguration) throws(TokenFetchError) {
        self.configuration = configuration
        if let path = configuration.keyFile {
            key = try SigningKey.load(
                algorithm: configuration.algorithm, contents: try SecretFile.read(path), path: path)
        } else {
            key = try SigningKey.generate(algorithm: configuration.algorithm)
        }
        keyID = configuration.keyID ?? key.thumbprint()
    }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        try mint(now: WallTime())
    }

    /// Signs one token issued at `now`.
    public func mint(now: WallTime) throws(TokenFetchError) -> FetchedToken {
        guard let issuedAt = now.wholeSecondsSince1970 else {
            throw .internalError("the clock reads a time a JWT cannot carry")
        }
        let header = JSONText.object([
            ("alg", JSONText.quoted(configuration.algorithm.rawValue)), ("typ", JSONText.quoted("JWT")),
            ("kid", JSONText.quoted(keyID)),
        ])
        let claims = JSONText.object([
            ("iss", JSONText.quoted(configuration.issuer)),
            ("sub", JSONText.quoted(configuration.subject)),
            ("aud", JSONText.quoted(configuration.audience)),
            ("iat", String(issuedAt)),
            ("nbf", String(issuedAt)),
            ("exp", String(issuedAt + Int64(configuration.lifetimeSec))),
            ("jti", JSONText.quoted(Base64URL.encode(try Crypto.randomBytes(16)))),
        ])
        let signingInput = Base64URL.encode(header) + "." + Base64URL.encode(claims)
        let signature = try key.sign(Array(signingInput.utf8))
        return FetchedToken(
            accessToken: signingInput + "." + Base64URL.encode(signature), tokenType: "Bearer",
            lifetime: .seconds(configuration.lifetimeSec))
    }

    /// The public key as one JWK (RFC 7517 §4); nil for HS256, whose secret is never published.
    public var publicJWK: String? {
        guard let members = key.publicJWKMembers() else { return nil }
        return JSONText.object(
            members.map { ($0.0, JSONText.quoted($0.1)) } + [
                ("kid", JSONText.quoted(keyID)), ("use", JSONText.quoted("sig")),
                ("alg", JSONText.quoted(configuration.algorithm.rawValue)),
            ])
    }

    /// A JWK Set (RFC 7517 §5) of the given signers' public keys.
    public static func jwks(_ signers: [JWTSigner]) -> String {
        "{\"keys\":[" + signers.compactMap(\.publicJWK).joined(separator: ",") + "]}"
    }
}
