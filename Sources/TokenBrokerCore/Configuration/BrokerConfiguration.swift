/// The whole broker: its two listeners and its providers.
///
/// Read from a JSON file (`--config FILE` or `TOKEN_BROKER_CONFIG`); every key is optional, and
/// with no file at all the broker runs one `default` provider on the local JWT signer.
public struct BrokerConfiguration: Sendable, Equatable {
    /// The token listener. Default `127.0.0.1:8080`; env `TOKEN_BROKER_LISTEN` overrides it.
    public var listen: ListenAddress
    /// The admin listener (`/healthz`). Default `127.0.0.1:9090`; env `TOKEN_BROKER_ADMIN_LISTEN` overrides it.
    public var adminListen: ListenAddress
    /// The providers; the first is the one served at `/token`. Default: one `default` provider.
    public var providers: [ProviderConfiguration]
    /// Most connections open at once, per listener. Default 16000; 16–1000000.
    public var connectionLimit: Int
    /// Seconds a connection may stay idle before it is closed; also the longest a client may
    /// take to send a request's headers, however it dribbles them (slow-loris). Default 30; 1–3600.
    public var connectionTimeoutSec: Int
    /// The file mode of Unix socket listeners, as octal text. Default "0660"; "0600"–"0777".
    public var unixSocketMode: UInt32
    /// Proxies under `/proxy/{name}/`: forward requests with a token added. Default: none.
    public var proxies: [ProxyConfiguration] = []
    /// A JSON file of the callers' keys (their SHA-256 hashes) and the providers each may read.
    /// Without it, any client that can connect may read every provider.
    public var clientKeysFile: String?
    /// Each connection's buffer for request and answer headers, in KiB; larger request headers
    /// get 431. Default 4 (about 3 KiB of request headers); 4–1024.
    public var connectionMemoryKiB: Int
    /// Require `Token-Broker-Request: true` on token routes and refuse `X-Forwarded-For`. Default true.
    public var requestGuard: Bool
    /// The longest a request may wait for a token (on-demand fetches, long-polls). Default 60; 1–3600.
    public var maxWaitSec: Int
    /// The longest a reload waits for its new providers (replacements and added ones) to get
    /// their first token, and for its token files to hold one again; past it, the reload is
    /// abandoned and the running configuration stays. Default 30; 1–600.
    public var reloadTimeoutSec = 30
    /// Token files: each new token of a provider written to a file. Default: none.
    public var sinks: [SinkConfiguration] = []
    /// The cloud SDKs' own token protocols (Google's metadata server, Azure managed identity). Default: none.
    public var compat = CompatConfiguration()
    /// Where tokens are kept beyond the process (`StoreConfiguration`). Default: memory only.
    public var store = StoreConfiguration.memory
    /// How log lines are written. Default logfmt.
    public var logFormat = LogFormat.logfmt
    /// The file the configuration was read from, as given (`--config`, `TOKEN_BROKER_CONFIG`);
    /// nil for the embedded default. Not a key: `Options.load` sets it, so that no token file is
    /// written over it (`filesUsed`).
    public var configurationFile: String?

    /// The shape of a log line: `key=value` pairs (logfmt), or one JSON object.
    public enum LogFormat: String, Sendable, Equatable {
        case logfmt
        case json
    }

    public static let defaultListen = "127.0.0.1:8080"
    public static let defaultAdminListen = "127.0.0.1:9090"

    public init(
        listen: ListenAddress? = nil, adminListen: ListenAddress? = nil,
        providers: [ProviderConfiguration] = [ProviderConfiguration()],
        connectionLimit: Int = 16_000, connectionTimeoutSec: Int = 30, maxWaitSec: Int = 60
    ) {
        self.maxWaitSec = maxWaitSec
        self.requestGuard = true
        self.connectionMemoryKiB = 4
        self.listen = listen ?? (try! ListenAddress(parsing: Self.defaultListen))
        self.adminListen = adminListen ?? (try! ListenAddress(parsing: Self.defaultAdminListen))
        self.providers = providers
        self.connectionLimit = connectionLimit
        self.connectionTimeoutSec = connectionTimeoutSec
        self.unixSocketMode = 0o660
        self.clientKeysFile = nil
    }

    /// Reads and checks a configuration document.
    public init(json: some Collection<UInt8>) throws(ConfigurationError) {
        try self.init(document: try Self.document(json))
    }

    /// A configuration file's text as a JSON document, not yet read as a configuration.
    public static func document(_ json: some Collection<UInt8>) throws(ConfigurationError) -> JSONValue {
        do {
            return try JSONValue(parsing: json)
        } catch {
            throw ConfigurationError(key: "", "the file is not valid JSON (\(error))")
        }
    }

    /// The `logFormat` a document asks for, when it is a JSON object whose `logFormat` is one;
    /// nil otherwise, whatever else the document holds. Read before anything else, so that the
    /// errors found in the rest of the file are logged in the format it asks for.
    public static func logFormat(in document: JSONValue) -> LogFormat? {
        guard case .object(let members) = document, case .string(let text)? = members["logFormat"] else { return nil }
        return LogFormat(rawValue: text)
    }

    /// Reads and checks a configuration document already parsed (`document(_:)`).
    public init(document: JSONValue) throws(ConfigurationError) {
        var reader = try ObjectReader(document, path: "")
        self.init()
        if let text = try reader.string("listen") { listen = try Self.address(text, key: "listen") }
        if let text = try reader.string("adminListen") { adminListen = try Self.address(text, key: "adminListen") }
        connectionLimit = try reader.int("connectionLimit", 16...1_000_000, default: connectionLimit)
        connectionTimeoutSec = try reader.int("connectionTimeoutSec", 1...3600, default: connectionTimeoutSec)
        maxWaitSec = try reader.int("maxWaitSec", 1...3600, default: maxWaitSec)
        reloadTimeoutSec = try reader.int("reloadTimeoutSec", 1...600, default: reloadTimeoutSec)
        requestGuard = try reader.bool("requestGuard", default: requestGuard)
        connectionMemoryKiB = try reader.int("connectionMemoryKiB", 4...1024, default: connectionMemoryKiB)
        if let text = try reader.string("logFormat") {
            guard let format = LogFormat(rawValue: text) else {
                throw ConfigurationError(
                    key: "logFormat", "\(JSONText.quoted(text)) is not a log format; allowed: \"logfmt\", \"json\"")
            }
            logFormat = format
        }
        if let text = try reader.string("unixSocketMode") {
            guard text.count <= 4, let mode = UInt32(text, radix: 8), (0o600...0o777).contains(mode) else {
                throw ConfigurationError(
                    key: "unixSocketMode",
                    "\"\(text)\" is not a file mode; allowed: octal text from \"0600\" to \"0777\", such as \"0660\"")
            }
            unixSocketMode = mode
        }
        if let path = try reader.string("clientKeysFile") {
            guard !path.isEmpty else {
                throw ConfigurationError(key: "clientKeysFile", "must be a file path")
            }
            clientKeysFile = path
        }
        if let items = try reader.array("providers") {
            guard !items.isEmpty else {
                throw ConfigurationError(key: "providers", "must list at least one provider")
            }
            providers = []
            for item in items {
                providers.append(try ProviderConfiguration(reading: item.value, path: item.path))
            }
        }
        if let items = try reader.array("proxies") {
            for item in items { proxies.append(try ProxyConfiguration(reading: item.value, path: item.path)) }
        }
        if let items = try reader.array("sinks") {
            for item in items { sinks.append(try SinkConfiguration(reading: item.value, path: item.path)) }
        }
        if var compatReader = try reader.object("compat") { compat = try CompatConfiguration(reading: &compatReader) }
        if var storeReader = try reader.object("store") { store = try StoreConfiguration(reading: &storeReader) }
        try reader.finish()
        try validate()
    }

    /// Resolves every relative file path (keys, secrets, token files, TLS files, `clientKeysFile`, sinks, the store)
    /// against `directory`, the configuration file's own, so that a configuration names the same
    /// files whatever the working directory. Absolute paths are kept as written.
    public mutating func resolvePaths(relativeTo directory: String) {
        rewritePaths { path in
            guard !path.isEmpty, !path.hasPrefix("/"), directory != "." else { return path }
            return directory.hasSuffix("/") ? directory + path : directory + "/" + path
        }
    }

    /// Every file the broker reads or makes besides its token files: the configuration file,
    /// keys, secret files, TLS files, `clientKeysFile`, a `file` source's token, the identity
    /// header file, the store's key file, password file, directory or socket (the paths
    /// `resolvePaths` resolves, so that a key added there is found here too), and the Unix
    /// sockets it listens on. A token file written over one of them would destroy it
    /// (`Broker.openSinkDirectories` refuses that).
    public var filesUsed: [String] {
        var paths = configurationFile.map { [$0] } ?? []
        var visited = self
        visited.rewritePaths(includingSinks: false) { path in
            paths.append(path)
            return path
        }
        let listeners = [listen, adminListen, compat.gce?.listen, compat.azure?.listen]
        return paths + listeners.compactMap { $0?.unixPath }
    }

    /// Rewrites every file path of the configuration with `rewrite`; the token files' only when `includingSinks`.
    private mutating func rewritePaths(includingSinks: Bool = true, _ rewrite: (String) -> String) {
        clientKeysFile = clientKeysFile.map(rewrite)
        for index in providers.indices { providers[index].source.resolvePaths(rewrite) }
        for index in proxies.indices { proxies[index].upstream.resolvePaths(rewrite) }
        if includingSinks { for index in sinks.indices { sinks[index].path = rewrite(sinks[index].path) } }
        if let path = compat.azure?.identityHeaderFile { compat.azure?.identityHeaderFile = rewrite(path) }
        store.resolvePaths(rewrite)
    }

    /// The directory of a file path: `/etc/tb` for `/etc/tb/config.json`, `.` for `config.json`.
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// Applies the environment's overrides, `TOKEN_BROKER_LISTEN` and `TOKEN_BROKER_ADMIN_LISTEN`
    /// (`listener(_:environment:)`: set but empty, the file's listener stays). An error about a
    /// listener set there names the variable too: "listen (from TOKEN_BROKER_LISTEN)".
    public mutating func applyEnvironment(_ environment: [String: String]) throws(ConfigurationError) {
        var overridden: [String: String] = [:]
        for listener in Listener.allCases {
            guard let address = try Self.listener(listener, environment: environment) else { continue }
            self[keyPath: listener.setting] = address
            overridden[listener.rawValue] = listener.environmentVariable
        }
        try validate(overridden: overridden)
    }

    /// The broker's two listeners, by their keys.
    public enum Listener: String, Sendable, CaseIterable {
        case listen, adminListen

        /// The configuration's setting of this listener.
        public var setting: WritableKeyPath<BrokerConfiguration, ListenAddress> {
            switch self {
            case .listen: \.listen
            case .adminListen: \.adminListen
            }
        }

        /// The environment variable that overrides the file's key.
        public var environmentVariable: String {
            switch self {
            case .listen: "TOKEN_BROKER_LISTEN"
            case .adminListen: "TOKEN_BROKER_ADMIN_LISTEN"
            }
        }
    }

    /// A listener as the environment sets it (`TOKEN_BROKER_LISTEN`, `TOKEN_BROKER_ADMIN_LISTEN`);
    /// nil when its variable is not set, or set but empty: the image sets both, and a container
    /// can only empty them to get the file's listener back. Not a listen address, it is an error
    /// naming the variable.
    public static func listener(_ listener: Listener, environment: [String: String]) throws(ConfigurationError)
        -> ListenAddress?
    {
        let variable = listener.environmentVariable
        guard let text = environment[variable], !text.isEmpty else { return nil }
        return try address(text, key: variable)
    }

    /// A listener as a configuration document gives it (nil: no file, the embedded default), read
    /// leniently, for the commands that ask a running broker (`healthcheck`, `token`, `status`,
    /// `reload`): the document must be a JSON object, and its key, when given, a listen address;
    /// the rest of the document is not read at all. That broker checked its file when it started
    /// or reloaded it; a mistake made in the file since is for it to find, at its next reload,
    /// and does not keep a command from finding it.
    public static func listener(_ listener: Listener, in document: JSONValue?) throws(ConfigurationError)
        -> ListenAddress
    {
        let key = listener.rawValue
        let text: String?
        if let document {
            var reader = try ObjectReader(document, path: "")
            text = try reader.string(key)
        } else {
            text = nil
        }
        guard let text else { return BrokerConfiguration()[keyPath: listener.setting] }
        return try address(text, key: key)
    }

    /// A configuration document's `reloadTimeoutSec`, read leniently as `listener(_:in:)` reads a
    /// listener: the default (30) when the document does not give it (nil: no file); nil when the
    /// document is not an object or its value is not one the broker takes (1–600).
    public static func reloadTimeoutSec(in document: JSONValue?) -> Int? {
        let fallback = BrokerConfiguration().reloadTimeoutSec
        guard let document else { return fallback }
        guard var reader = try? ObjectReader(document, path: "") else { return nil }
        do {
            return try reader.int("reloadTimeoutSec", 1...600) ?? fallback
        } catch {
            return nil
        }
    }

    /// The value of the environment variable `name`, nil when it is not set. Set but empty, it is
    /// an error naming the variable: an empty value is a slip (a template's variable left
    /// unfilled), and taking it as unset would run something else than meant, such as the
    /// embedded default with its own signer. `unset` says what applies without the variable.
    public static func environmentValue(_ name: String, in environment: [String: String], unset: String)
        throws(ConfigurationError) -> String?
    {
        guard let value = environment[name] else { return nil }
        guard !value.isEmpty else {
            throw ConfigurationError(key: name, "is set but empty; unset it for \(unset), or give a value")
        }
        return value
    }

    /// Checks what no single key can: unique provider names, distinct listeners, proxies on
    /// ordinary providers, and sinks on providers that exist and keep their token fresh.
    public func validate() throws(ConfigurationError) {
        try validate(overridden: [:])
    }

    /// `validate()`, naming the environment variable beside each key in `overridden` (key:
    /// variable), whose value came from there and not from the file.
    private func validate(overridden: [String: String]) throws(ConfigurationError) {
        var seen: Set<String> = []
        for (index, provider) in providers.enumerated() where !seen.insert(provider.name).inserted {
            throw ConfigurationError(
                key: "providers[\(index)].name",
                "duplicate provider name \"\(provider.name)\"; allowed: names unique across providers")
        }
        var proxyNames: Set<String> = []
        for (index, proxy) in proxies.enumerated() {
            guard proxyNames.insert(proxy.name).inserted else {
                throw ConfigurationError(
                    key: "proxies[\(index)].name",
                    "duplicate proxy name \"\(proxy.name)\"; allowed: names unique across proxies")
            }
            if let provider = proxy.provider, !seen.contains(provider) {
                throw ConfigurationError(
                    key: "proxies[\(index)].provider",
                    "no provider is named \"\(provider)\"; allowed: \(providers.map(\.name).joined(separator: ", "))")
            }
            // A proxied request names no audience, scope or resource: it has no child to take a token from.
            if let provider = providers.first(where: { $0.name == proxy.provider ?? providers.first?.name }),
                provider.isTemplate
            {
                throw ConfigurationError(
                    key: "proxies[\(index)].provider",
                    "proxies need an ordinary provider; \"\(provider.name)\" is a template (perRequest)"
                        + (proxy.provider == nil ? ", and the first provider is the default" : ""))
            }
        }
        try validateSinks()
        try compat.validate(providers: providers)
        var listeners: [(String, ListenAddress)] = [("listen", listen), ("adminListen", adminListen)]
        if let address = compat.gce?.listen { listeners.append(("compat.gce.listen", address)) }
        if let address = compat.azure?.listen { listeners.append(("compat.azure.listen", address)) }
        func named(_ key: String) -> String { overridden[key].map { "\(key) (from \($0))" } ?? key }
        // Listeners that cannot both bind: the same address, or one on a wildcard (0.0.0.0, ::)
        // and another on the same port of the same family.
        for (index, (key, address)) in listeners.enumerated() {
            guard let (other, otherAddress) = listeners[..<index].first(where: { $0.1.overlaps(address) }) else {
                continue
            }
            if address == otherAddress {
                throw ConfigurationError(
                    key: named(key), "\(address) is also \(named(other)); allowed: a different address or port")
            }
            if address.isWildcard == otherAddress.isWildcard {
                // One address written two ways, such as [::1] and [0:0:0:0:0:0:0:1].
                throw ConfigurationError(
                    key: named(key),
                    "\(address) is also \(named(other)), written \(otherAddress); allowed: a different address or port")
            }
            let wildcard = (address.isWildcard ? address : otherAddress).host
            let family = address.isIPv6 ? "IPv6" : "IPv4"
            throw ConfigurationError(
                key: named(key),
                "\(address) overlaps \(named(other)) \(otherAddress): \(wildcard) takes port \(address.port) on every "
                    + "\(family) address; allowed: a different port")
        }
    }

    /// Each sink names a provider that refreshes in the background, values its template
    /// allows, and a path no other sink writes.
    private func validateSinks() throws(ConfigurationError) {
        var paths: Set<String> = []
        // Each template's children that the sinks hold, by their values: start refuses more than
        // `maxChildren`, so the check must too.
        var held: [String: Set<TokenRequestValues>] = [:]
        for (index, sink) in sinks.enumerated() {
            let key = "sinks[\(index)]"
            guard let provider = providers.first(where: { $0.name == sink.provider }) else {
                throw ConfigurationError(
                    key: "\(key).provider",
                    "no provider is named \"\(sink.provider)\"; allowed: \(providers.map(\.name).joined(separator: ", "))"
                )
            }
            guard provider.backgroundRefreshEnabled else {
                throw ConfigurationError(
                    key: "\(key).provider",
                    "provider \"\(provider.name)\" has backgroundRefreshEnabled false; a token file needs a provider "
                        + "that keeps its token fresh")
            }
            switch sink.requestValues(for: provider) {
            case .failure(let problem):
                throw ConfigurationError(
                    key: "\(key).\(problem.parameter.rawValue)", Self.describe(problem, provider: provider))
            case .success(let values) where provider.isTemplate:
                held[provider.name, default: []].insert(values)
                guard held[provider.name, default: []].count <= provider.maxChildren else {
                    throw ConfigurationError(
                        key: key,
                        "template \"\(provider.name)\" cannot hold another child (maxChildren \(provider.maxChildren))")
                }
            case .success:
                break
            }
            guard paths.insert(sink.comparablePath).inserted else {
                throw ConfigurationError(
                    key: "\(key).path",
                    "\(JSONText.quoted(sink.path)) is written by another sink; allowed: one sink per file")
            }
        }
    }

    /// A sink's value refused by its provider, in words.
    private static func describe(_ problem: RequestValueProblem, provider: ProviderConfiguration) -> String {
        let parameter = problem.parameter.rawValue
        switch problem.kind {
        case .notAccepted:
            guard provider.isTemplate else {
                return "applies only to a template (a provider with perRequest); \"\(provider.name)\" is not one"
            }
            let taken = provider.perRequest.sorted().map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
            return "provider \"\(provider.name)\" does not take \"\(parameter)\" per request; its perRequest: \(taken)"
        case .malformed:
            return problem.parameter == .scope
                ? "must be scope tokens (visible ASCII without \" and \\) separated by single spaces, at most "
                    + "\(TokenRequestValues.maximumLength) bytes"
                : "must be 1–\(TokenRequestValues.maximumLength) visible ASCII characters, without spaces"
        case .notAllowed:
            let list: [AllowPattern]
            let listName: String
            switch problem.parameter {
            case .audience: (list, listName) = (provider.allowedAudiences, "allowedAudiences")
            case .scope: (list, listName) = (provider.allowedScopes, "allowedScopes")
            case .resource: (list, listName) = (provider.allowedResources, "allowedResources")
            }
            return "is outside provider \"\(provider.name)\"'s \(listName); allowed: "
                + list.map(\.description).joined(separator: ", ")
        case .missing:
            return "is required by provider \"\(provider.name)\" (its source's placeholders use it, and it has"
                + " no default)"
        }
    }

    private static func address(_ text: String, key: String) throws(ConfigurationError) -> ListenAddress {
        do {
            return try ListenAddress(parsing: text)
        } catch {
            throw ConfigurationError(key: key, error.message)
        }
    }
}
