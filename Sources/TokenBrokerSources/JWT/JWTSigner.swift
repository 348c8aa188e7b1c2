import TokenBrokerCore
import TokenBrokerCrypto

/// The local signer (`source.type: "jwt"`): mints JWTs itself, in ES256, RS256 or HS256.
///
/// This is the embedded default: with no configuration, the broker issues its own tokens and
/// publishes the public key at `/.well-known/jwks.json` so consumers can verify them.
///
/// As a template's source, a child's tokens carry its audience as `aud` (else the configured
/// one) and, when it names a scope, a `scope` claim with the scope set, space-separated. The
/// children sign with their template's key, so the one published key verifies them all.
public struct JWTSigner: TemplatedTokenSource {
    public let configuration: JWTSourceConfiguration
    public let key: SigningKey
    /// The `kid` of every token and of the published key.
    public let keyID: String
    public let values: TokenRequestValues

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
        values = .none
    }

    private init(child values: TokenRequestValues, of template: JWTSigner) {
        configuration = template.configuration
        key = template.key
        keyID = template.keyID
        self.values = values
    }

    /// A signer of `values.audience` (and scope) with this one's key; a resource is not used.
    public func child(for values: TokenRequestValues) -> JWTSigner {
        JWTSigner(child: values, of: self)
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
        var claims: [(String, String)] = [
            ("iss", JSONText.quoted(configuration.issuer)),
            ("sub", JSONText.quoted(configuration.subject)),
            ("aud", JSONText.quoted(values.audience ?? configuration.audience)),
        ]
        if let scope = values.scope { claims.append(("scope", JSONText.quoted(scope))) }
        claims += [
            ("iat", String(issuedAt)),
            ("nbf", String(issuedAt)),
            ("exp", String(issuedAt + Int64(configuration.lifetimeSec))),
            ("jti", JSONText.quoted(Base64URL.encode(try Crypto.randomBytes(16)))),
        ]
        let signingInput = Base64URL.encode(header) + "." + Base64URL.encode(JSONText.object(claims))
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

    /// A JWK Set (RFC 7517 §5) of the given signers' public keys, in their order, each key under
    /// each `kid` once (two signers with one key and one `kid` publish it once; one key under two
    /// `kid`s is published under each, since tokens name it by either).
    public static func jwks(_ signers: [JWTSigner]) -> String {
        var seen: Set<String> = []
        let keys = signers.compactMap(\.publicJWK).filter { seen.insert($0).inserted }
        return "{\"keys\":[" + keys.joined(separator: ",") + "]}"
    }

    /// Whether the JWKS would publish this signer's key and `other`'s, another key, under one
    /// `kid`: a verifier finds the key for a token by its `kid`, and could not tell which of the
    /// two verifies it (RFC 7517 §4.5). An HS256 secret is never published, so never clashes.
    public func publishesAnotherKey(underTheKeyIDOf other: JWTSigner) -> Bool {
        guard keyID == other.keyID, let mine = key.publicJWKMembers(), let theirs = other.key.publicJWKMembers() else {
            return false
        }
        return !mine.elementsEqual(theirs) { $0.0 == $1.0 && $0.1 == $1.1 }
    }

    /// The length in bytes of the shortest token this signer mints: each token's, but for what a
    /// template's child puts in it, a scope and, when the child is asked for one
    /// (`audienceAsked`), its own audience in place of the configured one (the shortest, an
    /// empty one, counted here). Only the dates and the `jti` differ between two tokens
    /// otherwise, each always as long (the dates have ten digits until 2286).
    public func shortestTokenBytes(audienceAsked: Bool) throws(TokenFetchError) -> Int {
        let signer = audienceAsked ? child(for: TokenRequestValues(audience: "")) : self
        return try signer.mint(now: WallTime()).accessToken.utf8.count
    }
}
