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
    public var scope: String?
    public var audience: String?
    /// Resource indicators (RFC 8707), each sent as a `resource` parameter.
    public var resources: [String] = []
    /// More form parameters, sent as given.
    public var extraParams: [(String, String)] = []
    /// The lifetime of a token whose answer has no `expires_in`, in seconds. Default 3600; 1–86400.
    public var defaultLifetimeSec: Int = 3600
    public var upstream = UpstreamConfiguration()

    public init(tokenURL: String, clientID: String) {
        self.tokenURL = tokenURL
        self.clientID = clientID
    }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let tokenURL = try reader.string("tokenURL") else {
            throw ConfigurationError(key: reader.keyPath("tokenURL"), "is required with type \"oauth2\"; allowed: the issuer's token endpoint URL")
        }
        try UpstreamConfiguration.checkURL(tokenURL, key: reader.keyPath("tokenURL"))
        guard let clientID = try reader.string("clientID"), !clientID.isEmpty else {
            throw ConfigurationError(key: reader.keyPath("clientID"), "is required with type \"oauth2\"")
        }
        self.init(tokenURL: tokenURL, clientID: clientID)
        clientSecret = try reader.string("clientSecret")
        clientSecretFile = try reader.string("clientSecretFile")
        clientAuth = try reader.choice("clientAuth", default: clientAuth)
        privateKeyFile = try reader.string("privateKeyFile")
        keyID = try reader.string("kid")
        scope = try reader.string("scope")
        audience = try reader.string("audience")
        switch reader.raw("resource") {
        case nil: break
        case .string(let one)?: resources = [one]
        case .array(let many)? where many.allSatisfy({ if case .string = $0 { true } else { false } }):
            resources = many.compactMap { if case .string(let text) = $0 { text } else { nil } }
        case let other?:
            throw ConfigurationError(key: reader.keyPath("resource"), "must be a string or an array of strings, not \(other.typeName)")
        }
        if var params = try reader.object("extraParams") {
            extraParams = try params.stringMembers()
        }
        defaultLifetimeSec = try reader.int("defaultLifetimeSec", 1...86_400, default: defaultLifetimeSec)
        upstream = try UpstreamConfiguration(reading: &reader)
        if clientAuth == .privateKeyJWT {
            guard privateKeyFile != nil else {
                throw ConfigurationError(key: reader.keyPath("privateKeyFile"), "is required with clientAuth \"private_key_jwt\"")
            }
        } else if (clientSecret == nil) == (clientSecretFile == nil) {
            throw ConfigurationError(key: reader.keyPath("clientSecretFile"), "give exactly one of clientSecret and clientSecretFile with clientAuth \"\(clientAuth)\"")
        }
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.tokenURL == rhs.tokenURL && lhs.clientID == rhs.clientID && lhs.clientSecret == rhs.clientSecret
            && lhs.clientSecretFile == rhs.clientSecretFile && lhs.clientAuth == rhs.clientAuth
            && lhs.privateKeyFile == rhs.privateKeyFile && lhs.keyID == rhs.keyID && lhs.scope == rhs.scope
            && lhs.audience == rhs.audience && lhs.resources == rhs.resources
            && lhs.extraParams.elementsEqual(rhs.extraParams, by: ==) && lhs.defaultLifetimeSec == rhs.defaultLifetimeSec
            && lhs.upstream == rhs.upstream
    }
}

/// A generic JSON token endpoint, `source.type: "http"`, for WAF-like and in-house token services.
public struct HTTPSourceConfiguration: Sendable, Equatable {
    /// A header value, given inline or read from a file at every fetch.
    public enum HeaderValue: Sendable, Equatable {
        case value(String)
        case file(String)
    }

    /// Required.
    public var url: String
    /// `GET` or `POST`. Default `POST`.
    public var method: String = "POST"
    /// Request headers; a value may be `{"file": "/path"}`.
    public var headers: [String: HeaderValue] = [:]
    /// The request body, sent as given. Default: none.
    public var body: String?
    /// Where the token is in the answer (RFC 6901). Default `/access_token`.
    public var tokenPointer: String = "/access_token"
    /// Where the lifetime in seconds is. Default: none.
    public var expiresInPointer: String?
    /// Where the expiry is, as seconds since 1970. Default: none.
    public var expiresAtPointer: String?
    /// The lifetime when the answer gives none and the token is not a JWT with `exp`. Default: none (no expiry); 1–86400.
    public var defaultLifetimeSec: Int?
    public var upstream = UpstreamConfiguration()

    public init(url: String) { self.url = url }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let url = try reader.string("url") else {
            throw ConfigurationError(key: reader.keyPath("url"), "is required with type \"http\"; allowed: the token service's URL")
        }
        try UpstreamConfiguration.checkURL(url, key: reader.keyPath("url"))
        self.init(url: url)
        method = try reader.choice("method", ["GET", "POST"], default: method)
        if var headerReader = try reader.object("headers") {
            for (name, value) in headerReader.allMembers() {
                let key = headerReader.keyPath(name)
                guard !name.isEmpty, name.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F && $0 != ":" }) else {
                    throw ConfigurationError(key: key, "is not a header name")
                }
                switch value {
                case .string(let text) where !text.contains(where: { $0 == "\r" || $0 == "\n" }):
                    headers[name] = .value(text)
                case .object(let members) where members.count == 1:
                    guard case .string(let path)? = members["file"] else { fallthrough }
                    headers[name] = .file(path)
                default:
                    throw ConfigurationError(key: key, "must be a string without CR or LF, or {\"file\": \"/path\"}")
                }
            }
        }
        body = try reader.string("body")
        tokenPointer = try reader.string("tokenPointer", default: tokenPointer)
        expiresInPointer = try reader.string("expiresInPointer")
        expiresAtPointer = try reader.string("expiresAtPointer")
        for (key, pointer) in [("tokenPointer", tokenPointer), ("expiresInPointer", expiresInPointer ?? ""), ("expiresAtPointer", expiresAtPointer ?? "")]
        where !pointer.isEmpty && !pointer.hasPrefix("/") {
            throw ConfigurationError(key: reader.keyPath(key), "\(JSONText.quoted(pointer)) is not a JSON Pointer; allowed: \"\" or a path such as /data/token")
        }
        if expiresInPointer != nil, expiresAtPointer != nil {
            throw ConfigurationError(key: reader.keyPath("expiresAtPointer"), "give at most one of expiresInPointer and expiresAtPointer")
        }
        defaultLifetimeSec = try reader.int("defaultLifetimeSec", 1...86_400)
        upstream = try UpstreamConfiguration(reading: &reader)
    }
}
