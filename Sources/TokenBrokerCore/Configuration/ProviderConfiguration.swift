/// One token provider: where its tokens come from and when it refreshes them.
///
/// The refresh keys carry the names and defaults of the AWS WAF mobile SDK's token provider.
/// The ranges are wider than the SDK's, since the tokens here are not only WAF tokens.
public struct ProviderConfiguration: Sendable, Equatable {
    /// The provider's name, used in `/providers/{name}/…`, logs and metrics. Default `default`;
    /// letters, digits, `-`, `_` and `.`, at most 64.
    public var name: String
    /// Where tokens come from. Default: the local JWT signer with a key generated at start.
    public var source: SourceConfiguration {
        didSet { requiredParameters = source.placeholderParameters }
    }
    /// Refresh in the background and serve from the cache. Default true.
    public var backgroundRefreshEnabled: Bool
    /// The longest time between background refreshes, and the idle time before refresh pauses.
    /// Default 300; 1–86400.
    public var tokenRefreshDelaySec: Int
    /// Failures followed by exponential backoff before the slow cadence. Default 5 with background
    /// refresh, 3 without; 0–10.
    public var maxRetryCount: Int?
    /// The slow retry cadence once backoff is used up, in milliseconds. Default 5000; 1–30000.
    public var maxErrorTokenRefreshDelayMsec: Int
    /// Pause background refresh after `tokenRefreshDelaySec` without reads. Default true.
    public var pauseWhenIdle: Bool
    /// Forced refreshes allowed per window. Default 5; 1–100.
    public var forcedRefreshMaxAttempts: Int
    /// The forced-refresh window, in seconds. Default 30; 1–3600.
    public var forcedRefreshWindowSec: Int
    /// How token answers also carry the token as a cookie (the WAF SDK's `setTokenCookie` and friends).
    public var cookie: CookieSettings
    /// The longest one fetch may take, in seconds; a fetch still running then counts as failed
    /// (`timeout`) and is abandoned. Default: the source's `timeoutMsec` plus 5 s for `oauth2`
    /// and `http`, 10 for `jwt` and `file`; 1–600.
    public var fetchTimeoutSec: Int?
    /// Makes the provider a template: the parameters a request may name (`audience`, `scope`,
    /// `resource`), each distinct combination getting a child provider of its own, made on its
    /// first request. Default: none (an ordinary provider).
    public var perRequest: Set<RequestParameter> = []
    /// The audiences a request may name; required when `perRequest` has `audience`.
    public var allowedAudiences: [AllowPattern] = []
    /// The scope tokens a request may name; required when `perRequest` has `scope`.
    public var allowedScopes: [AllowPattern] = []
    /// The resources a request may name; required when `perRequest` has `resource`.
    public var allowedResources: [AllowPattern] = []
    /// The most children a template keeps at once. Default 100; 1–10000.
    public var maxChildren: Int = 100
    /// A child nobody read (and no sink holds) for this long is dropped. Default 3600; 60–86400.
    public var childIdleSec: Int = 3600

    /// The parameters every request (and sink) for this template's children must name, since
    /// the source has no default for them: an `http` source's placeholders' (`{{audience}}` in
    /// its URL, a header value or its body); none for `oauth2` and `jwt`, whose configured values
    /// are the defaults. Follows `source`.
    public private(set) var requiredParameters: Set<RequestParameter>

    /// Whether this provider is a template (`perRequest` names a parameter).
    public var isTemplate: Bool { !perRequest.isEmpty }

    public init(
        name: String = "default",
        source: SourceConfiguration = .jwt(JWTSourceConfiguration()),
        backgroundRefreshEnabled: Bool = true,
        tokenRefreshDelaySec: Int = 300,
        maxRetryCount: Int? = nil,
        maxErrorTokenRefreshDelayMsec: Int = 5000,
        pauseWhenIdle: Bool = true,
        forcedRefreshMaxAttempts: Int = 5,
        forcedRefreshWindowSec: Int = 30,
        cookie: CookieSettings = CookieSettings(),
        fetchTimeoutSec: Int? = nil
    ) {
        self.cookie = cookie
        self.fetchTimeoutSec = fetchTimeoutSec
        self.name = name
        self.source = source
        self.requiredParameters = source.placeholderParameters
        self.backgroundRefreshEnabled = backgroundRefreshEnabled
        self.tokenRefreshDelaySec = tokenRefreshDelaySec
        self.maxRetryCount = maxRetryCount
        self.maxErrorTokenRefreshDelayMsec = maxErrorTokenRefreshDelayMsec
        self.pauseWhenIdle = pauseWhenIdle
        self.forcedRefreshMaxAttempts = forcedRefreshMaxAttempts
        self.forcedRefreshWindowSec = forcedRefreshWindowSec
    }

    /// `maxRetryCount`, or its default for the refresh mode.
    public var effectiveMaxRetryCount: Int { maxRetryCount ?? (backgroundRefreshEnabled ? 5 : 3) }

    /// `fetchTimeoutSec`, or its default for the source: past the source's own upstream timeout,
    /// so that an issuer's slowness is normally reported by the upstream client, with detail.
    public var effectiveFetchTimeout: Duration {
        if let fetchTimeoutSec { return .seconds(fetchTimeoutSec) }
        switch source {
        case .oauth2(let settings): return .milliseconds(settings.upstream.timeoutMsec) + .seconds(5)
        case .http(let settings): return .milliseconds(settings.upstream.timeoutMsec) + .seconds(5)
        case .jwt, .file: return .seconds(10)
        }
    }
}

extension ProviderConfiguration {
    init(reading value: JSONValue, path: String) throws(ConfigurationError) {
        var reader = try ObjectReader(value, path: path)
        self.init()
        name = try reader.string("name", default: name)
        guard !name.isEmpty, name.count <= 64,
            name.unicodeScalars.allSatisfy({
                $0.properties.isASCIIHexDigit || ("a"..."z").contains($0)
                    || ("A"..."Z").contains($0) || "-_.".unicodeScalars.contains($0)
            })
        else {
            throw ConfigurationError(
                key: reader.keyPath("name"), "\"\(name)\" is not a valid name; allowed: 1–64 of A–Z a–z 0–9 - _ .")
        }
        if let sourceReader = try reader.object("source") {
            source = try SourceConfiguration(reading: sourceReader)
        }
        requiredParameters = source.placeholderParameters
        backgroundRefreshEnabled = try reader.bool("backgroundRefreshEnabled", default: backgroundRefreshEnabled)
        tokenRefreshDelaySec = try reader.int("tokenRefreshDelaySec", 1...86_400, default: tokenRefreshDelaySec)
        maxRetryCount = try reader.int("maxRetryCount", 0...10)
        maxErrorTokenRefreshDelayMsec = try reader.int(
            "maxErrorTokenRefreshDelayMsec", 1...30_000, default: maxErrorTokenRefreshDelayMsec)
        pauseWhenIdle = try reader.bool("pauseWhenIdle", default: pauseWhenIdle)
        forcedRefreshMaxAttempts = try reader.int(
            "forcedRefreshMaxAttempts", 1...100, default: forcedRefreshMaxAttempts)
        forcedRefreshWindowSec = try reader.int("forcedRefreshWindowSec", 1...3600, default: forcedRefreshWindowSec)
        cookie = try CookieSettings(reading: &reader)
        fetchTimeoutSec = try reader.int("fetchTimeoutSec", 1...600)
        try readTemplateSettings(&reader)
        try reader.finish()
    }

    /// `perRequest`, the allow-lists and the children's bounds. Each allow-list belongs to its
    /// parameter: required with it, refused without it, as are the bounds without `perRequest`.
    private mutating func readTemplateSettings(_ reader: inout ObjectReader) throws(ConfigurationError) {
        let allowed = RequestParameter.allCases.map(\.rawValue)
        if let items = try reader.array("perRequest") {
            for item in items {
                guard case .string(let text) = item.value, let parameter = RequestParameter(rawValue: text) else {
                    throw ConfigurationError(
                        key: item.path, "must be one of \(allowed.map { "\"\($0)\"" }.joined(separator: ", "))")
                }
                guard perRequest.insert(parameter).inserted else {
                    throw ConfigurationError(key: item.path, "\"\(text)\" is listed twice")
                }
            }
            guard !perRequest.isEmpty else {
                throw ConfigurationError(
                    key: reader.keyPath("perRequest"), "must name at least one of \(allowed.joined(separator: ", "))")
            }
        }
        let lists: [(RequestParameter, String)] = [
            (.audience, "allowedAudiences"), (.scope, "allowedScopes"), (.resource, "allowedResources"),
        ]
        for (parameter, key) in lists {
            let patterns = try Self.patterns(&reader, key)
            if perRequest.contains(parameter), patterns == nil {
                throw ConfigurationError(
                    key: reader.keyPath(key),
                    "is required when perRequest has \"\(parameter.rawValue)\": list the values a request may name")
            }
            if patterns != nil, !perRequest.contains(parameter) {
                throw ConfigurationError(
                    key: reader.keyPath(key), "only applies when perRequest has \"\(parameter.rawValue)\"")
            }
            switch parameter {
            case .audience: allowedAudiences = patterns ?? []
            case .scope: allowedScopes = patterns ?? []
            case .resource: allowedResources = patterns ?? []
            }
        }
        let maxChildren = try reader.int("maxChildren", 1...10_000)
        let childIdleSec = try reader.int("childIdleSec", 60...86_400)
        if !isTemplate, maxChildren != nil || childIdleSec != nil {
            throw ConfigurationError(
                key: reader.keyPath(maxChildren != nil ? "maxChildren" : "childIdleSec"),
                "only applies to a template (a provider with perRequest)")
        }
        self.maxChildren = maxChildren ?? self.maxChildren
        self.childIdleSec = childIdleSec ?? self.childIdleSec
        if isTemplate, case .file = source {
            throw ConfigurationError(
                key: reader.keyPath("perRequest"), "a file source cannot make tokens per audience, scope or resource")
        }
        if perRequest.contains(.resource), case .jwt = source {
            throw ConfigurationError(
                key: reader.keyPath("perRequest"),
                "the local signer (source type \"jwt\") cannot make tokens per resource: a resource indicator"
                    + " (RFC 8707) is for an issuer's token endpoint; name the audience instead")
        }
        try source.checkTemplate(perRequest: perRequest, key: reader.keyPath("source"))
    }

    /// An allow-list: nil when absent, else its patterns (an empty list is refused).
    private static func patterns(_ reader: inout ObjectReader, _ key: String) throws(ConfigurationError)
        -> [AllowPattern]?
    {
        guard let items = try reader.array(key) else { return nil }
        guard !items.isEmpty else {
            throw ConfigurationError(key: reader.keyPath(key), "must list at least one value")
        }
        var patterns: [AllowPattern] = []
        for item in items {
            guard case .string(let text) = item.value, let pattern = AllowPattern(text) else {
                throw ConfigurationError(
                    key: item.path,
                    "must be a value, or a prefix ending in *, of visible ASCII characters (a lone * is refused)")
            }
            patterns.append(pattern)
        }
        return patterns
    }
}
