import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerUpstream

/// The client-credentials grant (RFC 6749 §4.4), `source.type: "oauth2"`.
///
/// Authenticates with `client_secret_basic` (the default), `client_secret_post`, or
/// `private_key_jwt` (RFC 7523, a fresh signed assertion per request). A secret file is read at
/// every fetch, so a rotated secret is used from the next retry on.
///
/// As a template's source, a child sends its `audience`, `scope` and `resource` (RFC 8707) in
/// place of the configured ones, which stay the defaults of what it does not name.
public struct OAuth2TokenSource: TemplatedTokenSource {
    public let configuration: OAuth2SourceConfiguration
    private let client: UpstreamHTTPClient
    private let assertionKey: SigningKey?
    public let values: TokenRequestValues

    public init(configuration: OAuth2SourceConfiguration, client: UpstreamHTTPClient = .shared) throws(TokenFetchError)
    {
        self.configuration = configuration
        self.client = client
        if configuration.clientAuth == .privateKeyJWT, let path = configuration.privateKeyFile {
            assertionKey = try SigningKey.loadAssertionKey(contents: try SecretFile.read(path), path: path)
        } else {
            assertionKey = nil
        }
        values = .none
    }

    private init(child values: TokenRequestValues, of template: OAuth2TokenSource) {
        configuration = template.configuration
        client = template.client
        assertionKey = template.assertionKey
        self.values = values
    }

    /// A source that asks for `values`, with this one's client, credentials and assertion key.
    public func child(for values: TokenRequestValues) -> OAuth2TokenSource {
        OAuth2TokenSource(child: values, of: self)
    }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        let (request, secrets) = try prepared(now: WallTime())
        let response = try await client.fetch(request)
        return try Self.token(
            from: response, defaultLifetime: configuration.defaultLifetimeSec, now: WallTime(), hiding: secrets)
    }

    /// Reads an RFC 6749 §5.1 answer into a token at `now`, or classifies what is wrong with it;
    /// each of `secrets` in the issuer's words becomes `[hidden]`. Without `expires_in`, an access
    /// token that is a JWT lives until its `exp`, and any other `defaultLifetime`.
    public static func token(
        from response: UpstreamResponse, defaultLifetime: Int, now: WallTime = WallTime(),
        hiding secrets: [String] = []
    ) throws(TokenFetchError) -> FetchedToken {
        try TokenEndpointAnswer.oauthToken(response, defaultLifetime: defaultLifetime, now: now, hiding: secrets)
    }

    /// The token request, ready to send.
    public func request(now: WallTime) throws(TokenFetchError) -> UpstreamRequest {
        try prepared(now: now).request
    }

    /// The token request, and the secrets it sends in every form they take in it (as is,
    /// form-encoded, in the Basic credentials), which an issuer's answer must not repeat.
    private func prepared(now: WallTime) throws(TokenFetchError) -> (request: UpstreamRequest, secrets: [String]) {
        var secrets: [String] = []
        var form: [(String, String)] = [("grant_type", "client_credentials")]
        if let scope = values.scope ?? configuration.scope { form.append(("scope", scope)) }
        if let audience = values.audience ?? configuration.audience { form.append(("audience", audience)) }
        for resource in values.resource.map({ [$0] }) ?? configuration.resources { form.append(("resource", resource)) }
        form += configuration.extraParams
        var headers: [(String, String)] = [
            ("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json"),
        ]
        switch configuration.clientAuth {
        case .clientSecretPost:
            let secret = try secret()
            secrets = [secret, FormEncoding.escape(secret)]
            form += [("client_id", configuration.clientID), ("client_secret", secret)]
        case .privateKeyJWT:
            let assertion = try assertion(now: now)
            secrets = [assertion]
            form += [
                ("client_id", configuration.clientID),
                ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                ("client_assertion", assertion),
            ]
        case .clientSecretBasic:
            // RFC 6749 §2.3.1: both parts form-encoded before Base64.
            let secret = try secret()
            let credentials = FormEncoding.escape(configuration.clientID) + ":" + FormEncoding.escape(secret)
            let encoded = Self.base64(Array(credentials.utf8))
            // Without its padding (an echo may drop it, and `=` tells nothing), and in base64url's alphabet too.
            let unpadded = String(encoded.prefix { $0 != "=" })
            let urlSafe = String(unpadded.map { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 })
            secrets = [secret, FormEncoding.escape(secret), unpadded, urlSafe]
            headers.append(("Authorization", "Basic " + encoded))
        }
        let request = UpstreamRequest(
            method: "POST", url: configuration.tokenURL, headers: headers, body: Array(FormEncoding.encode(form).utf8),
            settings: configuration.upstream)
        return (request, secrets)
    }

    private func secret() throws(TokenFetchError) -> String {
        if let inline = configuration.clientSecret { return inline }
        guard let path = configuration.clientSecretFile else { throw .configuration("no client secret configured") }
        return try SecretFile.readLine(path)
    }

    /// A `private_key_jwt` client assertion: iss and sub the client, aud the token endpoint,
    /// a unique jti, and a one-minute life (RFC 7523 §3).
    public func assertion(now: WallTime) throws(TokenFetchError) -> String {
        guard let key = assertionKey else { throw .configuration("no private key for private_key_jwt") }
        guard let issuedAt = now.wholeSecondsSince1970 else {
            throw .internalError("the clock reads a time a JWT cannot carry")
        }
        var header: [(String, String)] = [
            ("alg", JSONText.quoted(key.algorithm.rawValue)), ("typ", JSONText.quoted("JWT")),
        ]
        if let kid = configuration.keyID { header.append(("kid", JSONText.quoted(kid))) }
        let claims = JSONText.object([
            ("iss", JSONText.quoted(configuration.clientID)), ("sub", JSONText.quoted(configuration.clientID)),
            ("aud", JSONText.quoted(configuration.tokenURL)),
            ("jti", JSONText.quoted(Base64URL.encode(try Crypto.randomBytes(16)))),
            ("iat", String(issuedAt)), ("exp", String(issuedAt + 60)),
        ])
        let input = Base64URL.encode(JSONText.object(header)) + "." + Base64URL.encode(claims)
        return input + "." + Base64URL.encode(try key.sign(Array(input.utf8)))
    }

    private static func base64(_ bytes: [UInt8]) -> String {
        var text = Base64URL.encode(bytes).replacingUnderscoresAndDashes()
        while text.utf8.count % 4 != 0 { text += "=" }
        return text
    }
}

extension String {
    /// Base64url's alphabet back to standard Base64's.
    fileprivate func replacingUnderscoresAndDashes() -> String {
        String(map { $0 == "-" ? "+" : $0 == "_" ? "/" : $0 })
    }
}
