import Glibc

/// Where providers keep their tokens beyond the process, for every provider and template child:
/// the top-level `"store"`.
///
///     "store": {"type": "memory"}                                    the default: nothing kept
///     "store": {"type": "file", "path": "/var/lib/token-broker",     tokens survive a restart
///               "keyFile": "/etc/token-broker/store.key"}
///     "store": {"type": "redis", "address": "127.0.0.1:6379",        brokers on many hosts share
///               "keyFile": "/etc/token-broker/store.key", ...}        one fetch per refresh
///
/// Records are sealed with AES-256-GCM under the 32-byte key in `keyFile` (see `TokenBrokerStore`).
public enum StoreConfiguration: Sendable, Equatable {
    /// Tokens live in the broker's memory only.
    case memory
    /// Tokens are also kept in files in `path`, a directory, sealed with the key in `keyFile`.
    case file(path: String, keyFile: String)
    /// Tokens are kept in Redis and shared by every broker that uses it.
    case redis(RedisStoreSettings)

    /// The kinds a configuration may name.
    static let kinds = ["memory", "file", "redis"]

    /// The kind's name, as the configuration writes it.
    public var kind: String {
        switch self {
        case .memory: "memory"
        case .file: "file"
        case .redis: "redis"
        }
    }

    /// The file of the key that seals the records; nil for `memory`.
    public var keyFile: String? {
        switch self {
        case .memory: nil
        case .file(_, let keyFile): keyFile
        case .redis(let settings): settings.keyFile
        }
    }

    /// The files that hold secrets (the key, Redis's password), for the permission warning.
    public var secretFiles: [String] {
        switch self {
        case .memory: []
        case .file(_, let keyFile): [keyFile]
        case .redis(let settings): [settings.keyFile] + [settings.passwordFile].compactMap { $0 }
        }
    }

    mutating func resolvePaths(_ resolve: (String) -> String) {
        switch self {
        case .memory: break
        case .file(let path, let keyFile): self = .file(path: resolve(path), keyFile: resolve(keyFile))
        case .redis(var settings):
            settings.keyFile = resolve(settings.keyFile)
            settings.passwordFile = settings.passwordFile.map(resolve)
            if case .unix(let path) = settings.address { settings.address = .unix(resolve(path)) }
            self = .redis(settings)
        }
    }
}

/// The `redis` store's settings.
public struct RedisStoreSettings: Sendable, Equatable {
    /// Where Redis listens: a host (a name, an IPv4 address or `[IPv6]`) and a port, or a Unix socket.
    public enum Address: Sendable, Equatable, CustomStringConvertible {
        case tcp(host: String, port: Int)
        case unix(String)

        public var description: String {
            switch self {
            case .tcp(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
            case .unix(let path): "unix:" + path
            }
        }
    }

    /// Required.
    public var address: Address
    /// The ACL user (Redis 6 and later); nil: `AUTH` with the password alone, or no `AUTH`.
    public var username: String?
    /// A file holding the password; nil: no `AUTH`.
    public var passwordFile: String?
    /// The database `SELECT`ed. Default 0; 0–10000.
    public var database: Int = 0
    /// The start of every key and of the channel. Default `token-broker:`.
    public var keyPrefix: String = "token-broker:"
    /// Required: the 32-byte key that seals the records.
    public var keyFile: String
    /// How long a broker holds the refresh lease before another may fetch. Default 10000;
    /// `leaseMsecRange`.
    public var leaseMsec: Int = 10_000
    /// The lease lengths a broker may be configured with: no broker of a fleet takes one longer.
    public static let leaseMsecRange = 100...600_000
    /// The longest one call to Redis (connecting included) may take. Default 500; 10–60000.
    public var timeoutMsec: Int = 500

    public init(address: Address, keyFile: String) {
        self.address = address
        self.keyFile = keyFile
    }

    /// Parses `host:port`, `[IPv6]:port` or `unix:/absolute/path`.
    static func address(_ text: String) -> Address? {
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst("unix:".count))
            guard path.hasPrefix("/"), path.utf8.count <= ListenAddress.maximumUnixPathBytes, !path.utf8.contains(0)
            else { return nil }
            return .unix(path)
        }
        guard let colon = text.lastIndex(of: ":") else { return nil }
        let portText = text[text.index(after: colon)...]
        guard (1...5).contains(portText.utf8.count), portText.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
            let port = Int(portText), (1...65535).contains(port)
        else { return nil }
        var host = text[..<colon]
        if host.hasPrefix("[") {
            guard host.hasSuffix("]"), host.count > 2 else { return nil }
            host = host.dropFirst().dropLast()
            // The system's own parser decides what an IPv6 address is.
            var parsed = in6_addr()
            guard !host.contains("%"), inet_pton(AF_INET6, String(host), &parsed) == 1 else { return nil }
        } else {
            guard !host.isEmpty, host.utf8.count <= 253,
                host.utf8.allSatisfy({ byte in
                    (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                        || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
                })
            else { return nil }
        }
        return .tcp(host: String(host), port: port)
    }
}

extension StoreConfiguration {
    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let type = try reader.string("type") else {
            throw ConfigurationError(
                key: reader.keyPath("type"),
                "is required; allowed: " + Self.kinds.map { "\"\($0)\"" }.joined(separator: ", "))
        }
        switch type {
        case "memory":
            self = .memory
        case "file":
            let path = try Self.requiredPath(&reader, "path", example: "/var/lib/token-broker")
            let keyFile = try Self.requiredPath(&reader, "keyFile", example: "/etc/token-broker/store.key")
            self = .file(path: path, keyFile: keyFile)
        case "redis":
            guard let text = try reader.string("address") else {
                throw ConfigurationError(
                    key: reader.keyPath("address"), "is required: host:port or unix:/path, such as 127.0.0.1:6379")
            }
            guard let address = RedisStoreSettings.address(text) else {
                throw ConfigurationError(
                    key: reader.keyPath("address"),
                    "\(UpstreamConfiguration.shown(text)) is not a Redis address; allowed: host:port, [IPv6]:port or "
                        + "unix:/absolute/path, such as 127.0.0.1:6379")
            }
            let keyFile = try Self.requiredPath(&reader, "keyFile", example: "/etc/token-broker/store.key")
            var settings = RedisStoreSettings(address: address, keyFile: keyFile)
            if let username = try reader.string("username") {
                guard !username.isEmpty, username.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                    throw ConfigurationError(key: reader.keyPath("username"), "must be visible ASCII without spaces")
                }
                settings.username = username
            }
            if let path = try reader.string("passwordFile") {
                guard !path.isEmpty, !path.utf8.contains(0) else {
                    throw ConfigurationError(
                        key: reader.keyPath("passwordFile"), "must be a path without NUL, such as /run/secrets/redis")
                }
                settings.passwordFile = path
            }
            settings.database = try reader.int("database", 0...10_000, default: settings.database)
            if let prefix = try reader.string("keyPrefix") {
                guard (1...128).contains(prefix.utf8.count), prefix.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                    throw ConfigurationError(
                        key: reader.keyPath("keyPrefix"),
                        "must be 1–128 visible ASCII characters, such as token-broker:")
                }
                settings.keyPrefix = prefix
            }
            settings.leaseMsec = try reader.int(
                "leaseMsec", RedisStoreSettings.leaseMsecRange, default: settings.leaseMsec)
            settings.timeoutMsec = try reader.int("timeoutMsec", 10...60_000, default: settings.timeoutMsec)
            if settings.username != nil, settings.passwordFile == nil {
                throw ConfigurationError(key: reader.keyPath("username"), "needs passwordFile")
            }
            self = .redis(settings)
        default:
            throw ConfigurationError(
                key: reader.keyPath("type"),
                "\(JSONText.quoted(type)) is not a store; allowed: "
                    + Self.kinds.map { "\"\($0)\"" }.joined(separator: ", "))
        }
        try reader.finish()
    }

    private static func requiredPath(_ reader: inout ObjectReader, _ key: String, example: String)
        throws(ConfigurationError) -> String
    {
        guard let path = try reader.string(key), !path.isEmpty, !path.utf8.contains(0) else {
            throw ConfigurationError(key: reader.keyPath(key), "is required: a path without NUL, such as \(example)")
        }
        return path
    }
}
