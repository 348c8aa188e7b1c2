/// The OAuth 2.0 client-credentials grant (RFC 6749 §4.4), `source.type: "oauth2"`.
public struct OAuth2SourceConfiguration: Sendable, Equatable {
    /// The issuer's token endpoint. Required.
    public var tokenURL: String
    /// Required.
    public var clientID: String
    /// The client secret inline. Prefer `clientSecretFile`.
    public var clientSecret: String?
    /// A file holding the client secret, read at every fetch so a rotated secret is picked up.
    public var clientSecretFile: String?
    /// How the client authenticates. Default `client_secret_basic`.
    public var clientAuth: ClientAuth = .clientSecretBasic
    /// For `private_key_jwt` (RFC 7523): a PEM private key, RSA (RS256) or EC P-256 (ES256).
    public var privateKeyFile: String?
    /// For `private_key_jwt`: the assertion's `kid`. Default: none.
    public var keyID: String?
    /// The `scope` parameter. In a template with `perRequest: ["scope"]`, the default of a child
    /// that names none; a child's scope replaces it.
    public var scope: String?
    /// The `audience` parameter. In a template, the default that a child's audience replaces.
    public var audience: String?
    /// Resource indicators (RFC 8707), each sent as a `resource` parameter. In a template, the
    /// default that a child's one resource replaces.
    public var resources: [String] = []
    /// More form parameters, sent as given: none the broker sends itself (`sentByTheBroker`), nor
    /// one that `scope`, `audience` or `resource` sends already.
    public var extraParams: [(String, String)] = []
    /// The lifetime of a token whose answer has no `expires_in`, in seconds. Default 3600; 1–86400.
    public var defaultLifetimeSec: Int = 3600
    public var upstream = UpstreamConfiguration()

    public init(tokenURL: String, clientID: String) {
        self.tokenURL = tokenURL
        self.clientID = clientID
    }

    /// The form parameters every token request carries, under one client authentication or
    /// another, which `extraParams` may not repeat (RFC 6749 §3.2: a parameter is sent once).
    /// Under `client_secret_basic` the client's credentials are in the Authorization header, and
    /// a `client_id` or `client_secret` in the body would be a second way to authenticate, which
    /// RFC 6749 §2.3 forbids.
    static let sentByTheBroker = [
        "grant_type", "client_id", "client_secret", "client_assertion", "client_assertion_type",
    ]

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let tokenURL = try reader.string("tokenURL") else {
            throw ConfigurationError(
                key: reader.keyPath("tokenURL"),
                "is required with type \"oauth2\"; allowed: the issuer's token endpoint URL")
        }
        try UpstreamConfiguration.checkURL(tokenURL, key: reader.keyPath("tokenURL"))
        guard let clientID = try reader.string("clientID"), !clientID.isEmpty else {
            throw ConfigurationError(key: reader.keyPath("clientID"), "is required with type \"oauth2\"")
        }
        self.init(tokenURL: tokenURL, clientID: clientID)
        clientSecret = try reader.string("clientSecret")
        // As a clientSecretFile must hold (`SecretFile.readLine`); the message never shows it.
        if let clientSecret, clientSecret.isEmpty || clientSecret.contains(where: \.isNewline) {
            throw ConfigurationError(
                key: reader.keyPath("clientSecret"), "must be one non-empty line, as a clientSecretFile holds")
        }
        clientSecretFile = try reader.string("clientSecretFile")
        clientAuth = try reader.choice("clientAuth", default: clientAuth)
        privateKeyFile = try reader.string("privateKeyFile")
        keyID = try reader.string("kid")
        if keyID?.isEmpty == true {
            throw ConfigurationError(
                key: reader.keyPath("kid"), "must not be empty; leave it out for the key's thumbprint")
        }
        scope = try reader.string("scope")
        audience = try reader.string("audience")
        switch try reader.raw("resource") {
        case nil: break
        case .string(let one)?: resources = [one]
        case .array(let many)? where many.allSatisfy({ if case .string = $0 { true } else { false } }):
            resources = many.compactMap { if case .string(let text) = $0 { text } else { nil } }
        case let other?:
            throw ConfigurationError(
                key: reader.keyPath("resource"), "must be a string or an array of strings, not \(other.typeName)")
        }
        if var params = try reader.object("extraParams") {
            extraParams = try params.stringMembers()
        }
        let sentBySource = [("scope", scope != nil), ("audience", audience != nil), ("resource", !resources.isEmpty)]
        for (name, _) in extraParams {
            if Self.sentByTheBroker.contains(name) {
                throw ConfigurationError(
                    key: reader.keyPath("extraParams") + "." + name,
                    "the broker sends \(name) itself; allowed: other parameters")
            }
            if sentBySource.contains(where: { $0 == (name, true) }) {
                throw ConfigurationError(
                    key: reader.keyPath("extraParams") + "." + name, "source.\(name) is sent already; give one of them")
            }
        }
        defaultLifetimeSec = try reader.int("defaultLifetimeSec", 1...86_400, default: defaultLifetimeSec)
        upstream = try UpstreamConfiguration(reading: &reader)
        // A key of another client authentication would be taken and never used.
        if clientAuth == .privateKeyJWT {
            guard privateKeyFile != nil else {
                throw ConfigurationError(
                    key: reader.keyPath("privateKeyFile"), "is required with clientAuth \"private_key_jwt\"")
            }
            for (key, value) in [("clientSecret", clientSecret), ("clientSecretFile", clientSecretFile)]
            where value != nil {
                throw ConfigurationError(
                    key: reader.keyPath(key),
                    "applies only with clientAuth \"client_secret_basic\" or \"client_secret_post\", not \"private_key_jwt\""
                )
            }
        } else if let key = privateKeyFile != nil ? "privateKeyFile" : keyID != nil ? "kid" : nil {
            throw ConfigurationError(
                key: reader.keyPath(key), "applies only with clientAuth \"private_key_jwt\", not \"\(clientAuth)\"")
        } else if (clientSecret == nil) == (clientSecretFile == nil) {
            throw ConfigurationError(
                key: reader.keyPath("clientSecretFile"),
                "give exactly one of clientSecret and clientSecretFile with clientAuth \"\(clientAuth)\"")
        }
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.tokenURL == rhs.tokenURL && lhs.clientID == rhs.clientID && lhs.clientSecret == rhs.clientSecret
            && lhs.clientSecretFile == rhs.clientSecretFile && lhs.clientAuth == rhs.clientAuth
            && lhs.privateKeyFile == rhs.privateKeyFile && lhs.keyID == rhs.keyID && lhs.scope == rhs.scope
            && lhs.audience == rhs.audience && lhs.resources == rhs.resources
            && lhs.extraParams.elementsEqual(rhs.extraParams, by: ==)
            && lhs.defaultLifetimeSec == rhs.defaultLifetimeSec
            && lhs.upstream == rhs.upstream
    }
}
