/// The cloud SDKs' own token protocols, served so that an unchanged application gets the
/// broker's tokens by setting an environment variable: the Google metadata server (`gce`) and
/// Azure managed identity (`azure`). Each is off unless configured.
///
///     "compat": {
///       "gce": {"provider": "gcp", "identityProvider": "gcp-id", "projectId": "my-project",
///               "serviceAccountEmail": "broker@my-project.iam.gserviceaccount.com"},
///       "azure": {"identities": [{"provider": "azure"}], "identityHeaderFile": "identity-header"}
///     }
///
/// Both are served by provider templates (`perRequest`): the SDKs ask by scope, audience or resource.
public struct CompatConfiguration: Sendable, Equatable {
    public var gce: GCEConfiguration?
    public var azure: AzureConfiguration?

    public init(gce: GCEConfiguration? = nil, azure: AzureConfiguration? = nil) {
        self.gce = gce
        self.azure = azure
    }

    /// Whether no protocol is configured.
    public var isEmpty: Bool { gce == nil && azure == nil }
}

/// The Google metadata server's token routes (`/computeMetadata/v1/…`), as google-auth and the
/// other Google SDKs ask them when `GCE_METADATA_HOST` points at the broker.
public struct GCEConfiguration: Sendable, Equatable {
    /// The template of access tokens, by scope; required. Its `perRequest` must have `scope`.
    public var provider: String
    /// The template of identity tokens, by audience; nil: `…/identity` is not served. Its
    /// `perRequest` must have `audience`.
    public var identityProvider: String?
    /// `project/project-id`; required.
    public var projectId: String
    /// `project/numeric-project-id`; nil: not served (404).
    public var numericProjectId: String?
    /// The service account's email, also accepted in paths instead of `default`; required.
    public var serviceAccountEmail: String
    /// The account's scopes, listed by the metadata server and used when a token request names
    /// none. Default: `https://www.googleapis.com/auth/cloud-platform`. Each must be allowed by
    /// the template's `allowedScopes`.
    public var scopes: [String] = [Self.cloudPlatformScope]
    /// `universe/universe-domain`; nil: not served (404, which the SDKs read as `googleapis.com`).
    public var universeDomain: String?
    /// A listener of its own; nil: served on the token listener.
    public var listen: ListenAddress?

    public static let cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"

    public init(provider: String, projectId: String, serviceAccountEmail: String) {
        self.provider = provider
        self.projectId = projectId
        self.serviceAccountEmail = serviceAccountEmail
    }
}

/// Azure managed identity's token routes: App Service's (`/msi/token`, 2019-08-01) when
/// `identityHeaderFile` is set, and IMDS's (`/metadata/identity/oauth2/token`, 2018-02-01) when
/// `servesIMDS`: by default only without `identityHeaderFile`, since IMDS has no secret and
/// serves the same identities' tokens.
public struct AzureConfiguration: Sendable, Equatable {
    /// One managed identity: the template that makes its tokens and the ids a request names it by.
    public struct Identity: Sendable, Equatable {
        /// The template; its `perRequest` must have `resource` or `scope` (then `R/.default` is asked).
        public var provider: String
        /// `client_id`; nil with the two others: the system-assigned identity, asked without an id.
        public var clientId: String?
        /// `object_id`.
        public var objectId: String?
        /// `mi_res_id` (App Service) or `msi_res_id` (IMDS): the identity's Azure resource id.
        public var resourceId: String?

        public init(provider: String, clientId: String? = nil, objectId: String? = nil, resourceId: String? = nil) {
            self.provider = provider
            self.clientId = clientId
            self.objectId = objectId
            self.resourceId = resourceId
        }

        /// Whether this is the system-assigned identity (named by no id).
        public var isSystemAssigned: Bool { clientId == nil && objectId == nil && resourceId == nil }
    }

    /// The identities; at least one, at most one system-assigned.
    public var identities: [Identity]
    /// The file holding App Service's shared secret (`IDENTITY_HEADER`); nil: App Service's
    /// route is not served. Read at start; a trailing newline is not part of it.
    public var identityHeaderFile: String?
    /// Whether IMDS's route is served (`imds`); nil: only when `identityHeaderFile` is not set
    /// (`servesIMDS`). IMDS has no secret: served beside App Service's route, it hands the same
    /// tokens to any client of the listener without the secret, so that takes `true` here.
    public var imds: Bool?
    /// A listener of its own; nil: served on the token listener.
    public var listen: ListenAddress?

    public init(identities: [Identity], identityHeaderFile: String? = nil, imds: Bool? = nil) {
        self.identities = identities
        self.identityHeaderFile = identityHeaderFile
        self.imds = imds
    }

    /// Whether IMDS's route is served: `imds` when set; else only without App Service's secret.
    public var servesIMDS: Bool { imds ?? (identityHeaderFile == nil) }
}

extension CompatConfiguration {
    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        self.init()
        if var gceReader = try reader.object("gce") { gce = try GCEConfiguration(reading: &gceReader) }
        if var azureReader = try reader.object("azure") { azure = try AzureConfiguration(reading: &azureReader) }
        try reader.finish()
    }

    /// Checks the templates each protocol names against the providers.
    func validate(providers: [ProviderConfiguration]) throws(ConfigurationError) {
        func template(_ name: String, key: String, takes parameters: [RequestParameter])
            throws(ConfigurationError) -> ProviderConfiguration
        {
            guard let provider = providers.first(where: { $0.name == name }) else {
                throw ConfigurationError(
                    key: key,
                    "no provider is named \"\(name)\"; allowed: \(providers.map(\.name).joined(separator: ", "))")
            }
            // What the protocol sends the template: the first of `parameters` it takes (Azure's
            // resource, or the scope `R/.default` for a template of scopes).
            guard let sent = parameters.first(where: provider.perRequest.contains) else {
                let wanted = parameters.map { "\"\($0.rawValue)\"" }.joined(separator: " or ")
                throw ConfigurationError(
                    key: key, "provider \"\(name)\" must be a template whose perRequest has \(wanted)")
            }
            // A placeholder has no default: one the protocol never fills would refuse every request.
            let unsent = provider.requiredParameters.subtracting([sent])
            guard unsent.isEmpty else {
                let placeholders = unsent.sorted().map { "{{\($0.rawValue)}}" }.joined(separator: " and ")
                throw ConfigurationError(
                    key: key,
                    "provider \"\(name)\"'s source needs \(placeholders) in every request, which this protocol"
                        + " never sends (it sends \(sent.rawValue) only)")
            }
            return provider
        }
        if let gce {
            let provider = try template(gce.provider, key: "compat.gce.provider", takes: [.scope])
            let scopes = TokenRequestValues.checked(
                audience: nil, scope: gce.scopes.joined(separator: " "), resource: nil, for: provider)
            if case .failure = scopes {
                throw ConfigurationError(
                    key: "compat.gce.scopes",
                    "must be scopes provider \"\(provider.name)\" allows (its allowedScopes: "
                        + provider.allowedScopes.map(\.description).joined(separator: ", ") + ")")
            }
            if let identity = gce.identityProvider {
                _ = try template(identity, key: "compat.gce.identityProvider", takes: [.audience])
            }
        }
        if let azure {
            for (index, identity) in azure.identities.enumerated() {
                _ = try template(
                    identity.provider, key: "compat.azure.identities[\(index)].provider", takes: [.resource, .scope])
            }
        }
    }
}

extension GCEConfiguration {
    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        let provider = try CompatText.required(&reader, "provider")
        let projectId = try CompatText.required(&reader, "projectId")
        let email = try CompatText.required(&reader, "serviceAccountEmail")
        guard email.contains("@"), email != "default" else {
            throw ConfigurationError(key: reader.keyPath("serviceAccountEmail"), "must be an email address")
        }
        self.init(provider: provider, projectId: projectId, serviceAccountEmail: email)
        identityProvider = try CompatText.optional(&reader, "identityProvider")
        if let number = try CompatText.optional(&reader, "numericProjectId") {
            guard number.count <= 20, number.utf8.allSatisfy({ (48...57).contains($0) }) else {
                throw ConfigurationError(key: reader.keyPath("numericProjectId"), "must be 1–20 digits")
            }
            numericProjectId = number
        }
        universeDomain = try CompatText.optional(&reader, "universeDomain")
        if let items = try reader.array("scopes") {
            guard !items.isEmpty else {
                throw ConfigurationError(key: reader.keyPath("scopes"), "must list at least one scope")
            }
            var scopes: [String] = []
            for item in items {
                guard case .string(let scope) = item.value, CompatText.isValue(scope) else {
                    throw ConfigurationError(key: item.path, CompatText.rule)
                }
                scopes.append(scope)
            }
            self.scopes = scopes
        }
        listen = try CompatText.listen(&reader)
        try reader.finish()
    }
}

extension AzureConfiguration {
    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let items = try reader.array("identities"), !items.isEmpty else {
            throw ConfigurationError(
                key: reader.keyPath("identities"), "must list at least one identity, such as {\"provider\": \"azure\"}")
        }
        var identities: [Identity] = []
        for item in items {
            var identityReader = try ObjectReader(item.value, path: item.path)
            var identity = Identity(provider: try CompatText.required(&identityReader, "provider"))
            identity.clientId = try CompatText.optional(&identityReader, "clientId")
            identity.objectId = try CompatText.optional(&identityReader, "objectId")
            identity.resourceId = try CompatText.optional(&identityReader, "resourceId")
            try identityReader.finish()
            if identity.isSystemAssigned, identities.contains(where: \.isSystemAssigned) {
                throw ConfigurationError(
                    key: item.path,
                    "a second identity without clientId, objectId or resourceId; allowed: one "
                        + "system-assigned identity")
            }
            // In any case, as requests are matched: Azure's ids (GUIDs, resource ids) are the same
            // in any case, so an id listed twice in two cases names one identity, the first.
            for (key, id) in [("clientId", \Identity.clientId), ("objectId", \.objectId), ("resourceId", \.resourceId)]
            where identity[keyPath: id].map({ new in
                identities.contains { $0[keyPath: id]?.equalsIgnoringASCIICase(new) == true }
            }) == true {
                throw ConfigurationError(key: "\(item.path).\(key)", "names an identity already listed")
            }
            identities.append(identity)
        }
        self.init(identities: identities)
        if let path = try reader.string("identityHeaderFile") {
            guard !path.isEmpty else {
                throw ConfigurationError(key: reader.keyPath("identityHeaderFile"), "must be a file path")
            }
            identityHeaderFile = path
        }
        imds = try reader.bool("imds", default: identityHeaderFile == nil)
        guard servesIMDS || identityHeaderFile != nil else {
            throw ConfigurationError(
                key: reader.keyPath("imds"),
                "is false and there is no identityHeaderFile, so no route would be served; allowed: true, or"
                    + " an identityHeaderFile for App Service's route")
        }
        listen = try CompatText.listen(&reader)
        try reader.finish()
    }
}

/// The rules the protocols' text settings share.
private enum CompatText {
    static let rule = "must be 1–1024 visible ASCII characters, without spaces"

    static func isValue(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 1024 && text.utf8.allSatisfy { (0x21...0x7E).contains($0) }
    }

    static func optional(_ reader: inout ObjectReader, _ key: String) throws(ConfigurationError) -> String? {
        guard let text = try reader.string(key) else { return nil }
        guard isValue(text) else { throw ConfigurationError(key: reader.keyPath(key), rule) }
        return text
    }

    static func required(_ reader: inout ObjectReader, _ key: String) throws(ConfigurationError) -> String {
        guard let text = try optional(&reader, key) else {
            throw ConfigurationError(key: reader.keyPath(key), "is required")
        }
        return text
    }

    static func listen(_ reader: inout ObjectReader) throws(ConfigurationError) -> ListenAddress? {
        guard let text = try reader.string("listen") else { return nil }
        do {
            return try ListenAddress(parsing: text)
        } catch {
            throw ConfigurationError(key: reader.keyPath("listen"), error.message)
        }
    }
}
