/// Where a provider's tokens come from (`source.type`).
public enum SourceConfiguration: Sendable, Equatable {
    /// The local signer: JWTs minted by the broker itself.
    case jwt(JWTSourceConfiguration)
    /// A token file that someone else keeps fresh.
    case file(FileSourceConfiguration)
    /// The OAuth 2.0 client-credentials grant.
    case oauth2(OAuth2SourceConfiguration)
    /// A generic JSON token endpoint.
    case http(HTTPSourceConfiguration)

    /// The values `source.type` accepts today.
    public static let types = ["jwt", "oauth2", "http", "file"]

    /// The files that hold secrets (keys, client secrets, secret headers), for the start-up
    /// check that warns when others can read them.
    public var secretFiles: [String] {
        switch self {
        case .jwt(let settings): return settings.keyFile.map { [$0] } ?? []
        case .file: return []
        case .oauth2(let settings):
            return [settings.clientSecretFile, settings.privateKeyFile, settings.upstream.clientKeyFile].compactMap {
                $0
            }
        case .http(let settings):
            return settings.headers.values.compactMap { if case .file(let path) = $0 { path } else { nil } }.sorted()
                + [settings.upstream.clientKeyFile].compactMap { $0 }
        }
    }

    /// The files whose contents are the source's credentials: its `secretFiles`, and a TLS client
    /// certificate, which names the client to the issuer and to which a certificate-bound token
    /// (RFC 8705) is bound. Read at start and at each reload: a reload compares their contents
    /// (a change replaces the provider), and their digests are part of the settings a stored
    /// record must have been made under (`storeIdentity`), so that a broker presenting other
    /// credentials never serves the tokens fetched with these.
    public var credentialFiles: [String] {
        switch self {
        case .jwt, .file: return secretFiles
        case .oauth2(let settings): return secretFiles + [settings.upstream.clientCertFile].compactMap { $0 }
        case .http(let settings): return secretFiles + [settings.upstream.clientCertFile].compactMap { $0 }
        }
    }

    /// Rewrites every file path this source reads with `resolve` (a relative path becomes one
    /// under the configuration file's directory).
    mutating func resolvePaths(_ resolve: (String) -> String) {
        switch self {
        case .jwt(var settings):
            settings.keyFile = settings.keyFile.map(resolve)
            self = .jwt(settings)
        case .file(var settings):
            settings.path = resolve(settings.path)
            self = .file(settings)
        case .oauth2(var settings):
            settings.clientSecretFile = settings.clientSecretFile.map(resolve)
            settings.privateKeyFile = settings.privateKeyFile.map(resolve)
            settings.upstream.resolvePaths(resolve)
            self = .oauth2(settings)
        case .http(var settings):
            settings.headers = settings.headers.mapValues { value in
                if case .file(let path) = value { .file(resolve(path)) } else { value }
            }
            settings.upstream.resolvePaths(resolve)
            self = .http(settings)
        }
    }

    /// The parameters the source's placeholders use: an `http` source's; none for the others.
    public var placeholderParameters: Set<RequestParameter> {
        if case .http(let settings) = self { settings.placeholderParameters } else { [] }
    }

    /// Checks what a template's children would fetch with against `perRequest` (empty for a
    /// provider that is no template); `key` is the source's path, such as `providers[0].source`.
    ///
    /// An `http` source's placeholders must name parameters of `perRequest`; an `oauth2` source's
    /// `extraParams` may not hold a parameter of `perRequest`, which would then be sent twice.
    func checkTemplate(perRequest: Set<RequestParameter>, key: String) throws(ConfigurationError) {
        switch self {
        case .http(let settings):
            try settings.checkPlaceholders(perRequest: perRequest, key: key)
        case .oauth2(let settings):
            for (name, _) in settings.extraParams {
                guard let parameter = RequestParameter(rawValue: name), perRequest.contains(parameter) else { continue }
                throw ConfigurationError(
                    key: key + ".extraParams." + name,
                    "\"\(name)\" is named per request (perRequest); give its default as source.\(parameter.rawValue)")
            }
        case .jwt, .file:
            break
        }
    }

    init(reading reader: ObjectReader) throws(ConfigurationError) {
        var reader = reader
        let type = try reader.choice("type", Self.types, default: "jwt")
        switch type {
        case "file":
            self = .file(try FileSourceConfiguration(reading: &reader))
        case "oauth2":
            self = .oauth2(try OAuth2SourceConfiguration(reading: &reader))
        case "http":
            self = .http(try HTTPSourceConfiguration(reading: &reader))
        default:
            self = .jwt(try JWTSourceConfiguration(reading: &reader))
        }
        try reader.finish()
    }
}

/// The local JWT signer (`source.type: "jwt"`).
public struct JWTSourceConfiguration: Sendable, Equatable {
    /// The JWS algorithm. Default `ES256`; allowed `ES256`, `RS256`, `HS256`.
    public var algorithm: JWSAlgorithm
    /// A PEM private key (ES256, RS256) or a file of secret bytes (HS256). Default: none, and a
    /// key is generated at start.
    public var keyFile: String?
    /// The `kid` header and JWKS key id. Default: the key's RFC 7638 thumbprint.
    public var keyID: String?
    /// The `iss` claim. Default `token-broker`.
    public var issuer: String
    /// The `aud` claim. Default `token-broker`.
    public var audience: String
    /// The `sub` claim. Default `token-broker`.
    public var subject: String
    /// The token's lifetime in seconds (`exp - iat`). Default 900; 1–86400.
    public var lifetimeSec: Int

    public init(
        algorithm: JWSAlgorithm = .es256, keyFile: String? = nil, keyID: String? = nil, issuer: String = "token-broker",
        audience: String = "token-broker", subject: String = "token-broker", lifetimeSec: Int = 900
    ) {
        self.algorithm = algorithm
        self.keyFile = keyFile
        self.keyID = keyID
        self.issuer = issuer
        self.audience = audience
        self.subject = subject
        self.lifetimeSec = lifetimeSec
    }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        self.init()
        algorithm = try reader.choice("algorithm", default: algorithm)
        keyFile = try reader.string("keyFile")
        keyID = try reader.string("kid")
        if keyID?.isEmpty == true {
            throw ConfigurationError(
                key: reader.keyPath("kid"), "must not be empty; leave it out for the key's thumbprint")
        }
        issuer = try reader.string("issuer", default: issuer)
        audience = try reader.string("audience", default: audience)
        subject = try reader.string("subject", default: subject)
        lifetimeSec = try reader.int("lifetimeSec", 1...86_400, default: lifetimeSec)
        if algorithm == .hs256, keyFile == nil {
            // A generated HMAC secret could verify nothing outside the broker: no JWKS carries it.
            throw ConfigurationError(
                key: reader.keyPath("keyFile"),
                "is required with HS256; allowed: a file holding at least 32 secret bytes")
        }
    }
}

/// A token file (`source.type: "file"`).
public struct FileSourceConfiguration: Sendable, Equatable {
    /// The file holding the token. Required.
    public var path: String
    /// The lifetime of a token that is not a JWT with `exp`, in seconds. Default: none (no
    /// expiry; the file is read again every `tokenRefreshDelaySec`); 1–86400.
    public var lifetimeSec: Int?

    public init(path: String, lifetimeSec: Int? = nil) {
        self.path = path
        self.lifetimeSec = lifetimeSec
    }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let path = try reader.string("path"), !path.isEmpty else {
            throw ConfigurationError(
                key: reader.keyPath("path"), "is required with type \"file\"; allowed: the token file's path")
        }
        self.path = path
        lifetimeSec = try reader.int("lifetimeSec", 1...86_400)
    }
}

extension UpstreamConfiguration {
    /// Rewrites the TLS files' paths with `resolve`.
    mutating func resolvePaths(_ resolve: (String) -> String) {
        caFile = caFile.map(resolve)
        clientCertFile = clientCertFile.map(resolve)
        clientKeyFile = clientKeyFile.map(resolve)
    }
}

extension SourceConfiguration {
    /// What decides which token the source hands out, as text: a stored token made under other
    /// settings (another issuer, client, scope, claims, signing key) or other credentials is not
    /// served (`StoreSlot.settings`). Timing settings are left out: they change when a token is
    /// refreshed, not which token it is. Inline secrets (header values, a client secret) are in
    /// it as given; the contents of the `credentialFiles` are not read here: the broker appends
    /// their digests (`Broker.settingsDigest`). The text is only ever hashed, and kept sealed.
    ///
    /// A `file` source has no identity a record could carry: its path names a file of this host
    /// (another host's broker reads its own file at the same path, a pod's own projected token),
    /// and what the file holds changes with every token. Its tokens are not stored at all
    /// (`Broker.isStored`); the text here is only its path.
    public var storeIdentity: String {
        // A JSON object: every value quoted and every list bracketed, so that no two settings
        // write the same text (a resource `x=y` and an extra parameter `x` = `y`; a scope left out
        // and one given empty, which is sent as `scope=`).
        let quoted = JSONText.quoted
        func optional(_ value: String?) -> String { value.map(quoted) ?? "null" }
        func list(_ values: [String]) -> String { "[" + values.joined(separator: ",") + "]" }
        switch self {
        case .jwt(let settings):
            return JSONText.object([
                ("type", quoted("jwt")), ("algorithm", quoted(settings.algorithm.rawValue)),
                ("keyID", optional(settings.keyID)), ("issuer", quoted(settings.issuer)),
                ("audience", quoted(settings.audience)), ("subject", quoted(settings.subject)),
                ("lifetimeSec", String(settings.lifetimeSec)),
            ])
        case .file(let settings):
            return JSONText.object([("type", quoted("file")), ("path", quoted(settings.path))])
        case .oauth2(let settings):
            return JSONText.object([
                ("type", quoted("oauth2")), ("tokenURL", quoted(settings.tokenURL)),
                ("clientID", quoted(settings.clientID)), ("clientAuth", quoted(settings.clientAuth.rawValue)),
                ("keyID", optional(settings.keyID)), ("scope", optional(settings.scope)),
                ("audience", optional(settings.audience)), ("clientSecret", optional(settings.clientSecret)),
                ("resources", list(settings.resources.map(quoted))),
                ("extraParams", list(settings.extraParams.map { list([quoted($0.0), quoted($0.1)]) })),
            ])
        case .http(let settings):
            let headers = settings.headers.keys.sorted().map { name -> String in
                switch settings.headers[name] {
                case .value(let value)?: list([quoted(name), quoted("value"), quoted(value)])
                case .file(let path)?: list([quoted(name), quoted("file"), quoted(path)])
                case nil: list([quoted(name)])
                }
            }
            return JSONText.object([
                ("type", quoted("http")), ("method", quoted(settings.method)), ("url", quoted(settings.url)),
                ("body", optional(settings.body)), ("tokenPointer", quoted(settings.tokenPointer)),
                ("headers", list(headers)),
            ])
        }
    }
}
