import Testing
import TokenBrokerCore

/// The top-level `"store"`: memory by default, files with a key, Redis with its address, and
/// what is refused, each refusal naming its key.
@Suite struct StoreConfigurationTests {
    private func parse(_ json: String) throws(ConfigurationError) -> BrokerConfiguration {
        try BrokerConfiguration(json: Array(json.utf8))
    }

    @Test func memoryIsTheDefault() throws {
        #expect(try parse("{}").store == .memory)
        #expect(try parse(#"{"store": {"type": "memory"}}"#).store == .memory)
        #expect(StoreConfiguration.memory.keyFile == nil)
    }

    @Test func aFileStoreHasItsDirectoryAndKeyFile() throws {
        let store = try parse(
            #"{"store": {"type": "file", "path": "/var/lib/token-broker", "keyFile": "/etc/token-broker/store.key"}}"#
        ).store
        #expect(store == .file(path: "/var/lib/token-broker", keyFile: "/etc/token-broker/store.key"))
        #expect(store.keyFile == "/etc/token-broker/store.key")
    }

    @Test func relativePathsAreResolvedAgainstTheConfigurationFilesDirectory() throws {
        var configuration = try parse(
            #"{"store": {"type": "file", "path": "state", "keyFile": "keys/store.key"}}"#)
        configuration.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "/etc/tb/config.json"))
        #expect(configuration.store == .file(path: "/etc/tb/state", keyFile: "/etc/tb/keys/store.key"))

        var absolute = try parse(
            #"{"store": {"type": "file", "path": "/var/lib/tb", "keyFile": "store.key"}}"#)
        absolute.resolvePaths(relativeTo: "/etc/tb")
        #expect(absolute.store == .file(path: "/var/lib/tb", keyFile: "/etc/tb/store.key"), "absolute paths are kept")

        var here = try parse(#"{"store": {"type": "file", "path": "state", "keyFile": "store.key"}}"#)
        here.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "config.json"))
        #expect(here.store == .file(path: "state", keyFile: "store.key"), "a file in the working directory")

        var memory = try parse(#"{"store": {"type": "memory"}}"#)
        memory.resolvePaths(relativeTo: "/etc/tb")
        #expect(memory.store == .memory)
    }

    @Test func theTypeIsRequired() {
        #expect(
            configurationProblem(#"{"store": {}}"#) == #"store.type: is required; allowed: "memory", "file", "redis""#)
        #expect(
            configurationProblem(#"{"store": {"path": "/var/lib/tb", "keyFile": "k"}}"#)
                == #"store.type: is required; allowed: "memory", "file", "redis""#)
    }

    @Test func anUnknownTypeIsRefusedWithTheAllowedOnes() {
        #expect(
            configurationProblem(#"{"store": {"type": "disk"}}"#)
                == #"store.type: "disk" is not a store; allowed: "memory", "file", "redis""#)
        #expect(
            configurationProblem(#"{"store": {"type": "File"}}"#)
                == #"store.type: "File" is not a store; allowed: "memory", "file", "redis""#)
    }

    @Test func aFileStoreNeedsAPathAndAKeyFile() {
        #expect(
            configurationProblem(#"{"store": {"type": "file", "keyFile": "/etc/tb/store.key"}}"#)
                == "store.path: is required: a path without NUL, such as /var/lib/token-broker")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "", "keyFile": "/etc/tb/store.key"}}"#)
                == "store.path: is required: a path without NUL, such as /var/lib/token-broker")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "/var/lib/tb\u0000x", "keyFile": "k"}}"#)
                == "store.path: is required: a path without NUL, such as /var/lib/token-broker")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "/var/lib/tb"}}"#)
                == "store.keyFile: is required: a path without NUL, such as /etc/token-broker/store.key")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "/var/lib/tb", "keyFile": null}}"#)
                == "store.keyFile: is null; leave the key out for its default, or give a value")
    }

    @Test func wrongTypesNameTheKey() {
        #expect(configurationProblem(#"{"store": "file"}"#) == "store: must be an object, not a string")
        #expect(configurationProblem(#"{"store": {"type": 1}}"#) == "store.type: must be a string, not a number")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": ["/a"], "keyFile": "k"}}"#)
                == "store.path: must be a string, not an array")
    }

    @Test func anUnknownKeyInsideTheStoreIsNamedWithTheAllowedOnes() {
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "/var/lib/tb", "keyFile": "k", "ttl": 5}}"#)
                == "store.ttl: unknown key; allowed: type, path, keyFile")
        #expect(
            configurationProblem(#"{"store": {"type": "memory", "path": "/var/lib/tb"}}"#)
                == "store.path: unknown key; allowed: type")
        #expect(configurationProblem(#"{"stor": {"type": "memory"}}"#)?.hasPrefix("stor: unknown key") == true)
    }
}

/// The `redis` store's settings: its address in each form, its defaults and ranges, and what is
/// refused, each refusal naming its key.
@Suite struct RedisStoreConfigurationTests {
    /// The key file every configuration here names, and the address when a test does not vary it.
    private static let keyFile = "/etc/token-broker/store.key"
    private static let addressProblem =
        "is not a Redis address; allowed: host:port, [IPv6]:port or unix:/absolute/path, such as 127.0.0.1:6379"
    private static let allowedKeys =
        "type, address, keyFile, username, passwordFile, database, keyPrefix, leaseMsec, timeoutMsec"

    /// A `redis` store's JSON: `members` (JSON text, without braces) after the type.
    private static func json(_ members: String) -> String {
        #"{"store": {"type": "redis", "# + members + "}}"
    }

    /// A `redis` store at `address` with the key file, and `more` members (JSON text).
    private static func json(address: String, _ more: String = "") -> String {
        json(#""address": "# + JSONText.quoted(address) + #", "keyFile": ""# + keyFile + #"""# + more)
    }

    /// The settings a configuration holds; records an issue when it holds another store.
    private func settings(_ json: String) throws -> RedisStoreSettings? {
        let store = try BrokerConfiguration(json: Array(json.utf8)).store
        guard case .redis(let settings) = store else {
            Issue.record("expected a redis store, got \(store)")
            return nil
        }
        return settings
    }

    /// The address a configuration holds.
    private func address(_ text: String) throws -> RedisStoreSettings.Address? {
        try settings(Self.json(address: text))?.address
    }

    /// A refused address may hold a password (`redis://user:password@host`): the message
    /// quotes it without what comes before the `@`. So does a refused proxy target its query.
    @Test func aRefusedAddressOrTargetIsQuotedWithoutItsCredentials() {
        let address = configurationProblem(
            #"{"store": {"type": "redis", "address": "redis://u:SECRET-42@127.0.0.1:6379", "keyFile": "/k"}}"#)
        #expect(address?.contains("SECRET-42") == false, "\(address ?? "accepted")")
        #expect(address?.contains("\"redis://...@127.0.0.1:6379\" \(Self.addressProblem)") == true, "\(address ?? "")")
        let target = configurationProblem(
            #"{"proxies": [{"name": "p", "target": "https://api.example/v1?api_key=SECRET-42"}]}"#)
        #expect(target?.contains("SECRET-42") == false, "\(target ?? "accepted")")
        #expect(target?.contains("\"https://api.example/v1?...\" is not a base URL") == true, "\(target ?? "")")
    }

    @Test func theDefaultsAreDatabaseZeroThePrefixTheLeaseAndTheTimeout() throws {
        let json = Self.json(address: "127.0.0.1:6379")
        let store = try BrokerConfiguration(json: Array(json.utf8)).store
        #expect(store.kind == "redis")
        #expect(store.keyFile == Self.keyFile)
        #expect(store.secretFiles == [Self.keyFile], "no password file, only the key")
        guard let settings = try settings(json) else { return }
        #expect(settings.address == .tcp(host: "127.0.0.1", port: 6379))
        #expect(settings.keyFile == Self.keyFile)
        #expect(settings.username == nil)
        #expect(settings.passwordFile == nil)
        #expect(settings.database == 0)
        #expect(settings.keyPrefix == "token-broker:")
        #expect(settings.leaseMsec == 10_000)
        #expect(settings.timeoutMsec == 500)
        var expected = RedisStoreSettings(address: .tcp(host: "127.0.0.1", port: 6379), keyFile: Self.keyFile)
        #expect(store == .redis(expected))
        expected.database = 1
        #expect(store != .redis(expected))
    }

    @Test func everySettingIsRead() throws {
        let json = Self.json(
            address: "redis.internal:6380",
            #", "username": "broker", "passwordFile": "/run/secrets/redis", "database": 3, "keyPrefix": "tb/prod:", "#
                + #""leaseMsec": 2500, "timeoutMsec": 50"#)
        let store = try BrokerConfiguration(json: Array(json.utf8)).store
        #expect(store.secretFiles == [Self.keyFile, "/run/secrets/redis"])
        guard let settings = try settings(json) else { return }
        #expect(settings.address == .tcp(host: "redis.internal", port: 6380))
        #expect(settings.username == "broker")
        #expect(settings.passwordFile == "/run/secrets/redis")
        #expect(settings.database == 3)
        #expect(settings.keyPrefix == "tb/prod:")
        #expect(settings.leaseMsec == 2500)
        #expect(settings.timeoutMsec == 50)
    }

    /// `null` is not "not set": leaving a key out is. It was, and `"store": null` ran the memory
    /// store, `"passwordFile": null` logged in without a password, with nothing said.
    @Test func aNullMemberIsAnErrorNamingItsKey() {
        for key in ["username", "passwordFile", "database", "keyPrefix", "leaseMsec", "timeoutMsec"] {
            #expect(
                configurationProblem(Self.json(address: "127.0.0.1:6379", #", "\#(key)": null"#))
                    == "store.\(key): is null; leave the key out for its default, or give a value")
        }
        #expect(
            configurationProblem(#"{"store": null}"#)
                == "store: is null; leave the key out for its default, or give a value")
        #expect(
            configurationProblem(#"{"store": {"type": null}}"#)
                == "store.type: is null; leave the key out for its default, or give a value")
    }

    @Test(arguments: [
        ("127.0.0.1:6379", RedisStoreSettings.Address.tcp(host: "127.0.0.1", port: 6379), "127.0.0.1:6379"),
        ("localhost:6379", .tcp(host: "localhost", port: 6379), "localhost:6379"),
        (
            "redis-0.redis.svc.cluster.local:1", .tcp(host: "redis-0.redis.svc.cluster.local", port: 1),
            "redis-0.redis.svc.cluster.local:1"
        ),
        ("REDIS:65535", .tcp(host: "REDIS", port: 65535), "REDIS:65535"),
        ("[::1]:6379", .tcp(host: "::1", port: 6379), "[::1]:6379"),
        ("[2001:db8::7]:7000", .tcp(host: "2001:db8::7", port: 7000), "[2001:db8::7]:7000"),
        ("[::ffff:10.0.0.1]:6379", .tcp(host: "::ffff:10.0.0.1", port: 6379), "[::ffff:10.0.0.1]:6379"),
        ("unix:/run/redis/redis.sock", .unix("/run/redis/redis.sock"), "unix:/run/redis/redis.sock"),
    ])
    func anAddressIsAHostAndPortOrAUnixSocket(text: String, expected: RedisStoreSettings.Address, shown: String)
        throws
    {
        #expect(try address(text) == expected)
        #expect(expected.description == shown, "written back as configured")
    }

    @Test(arguments: [
        "localhost", "127.0.0.1", "[::1]", "localhost:", "localhost:0", "localhost:65536", "localhost:70000",
        "localhost:-1", "localhost:http", "localhost:6379x", ":6379", "[]:6379", "::1:6379", "[::1:6379",
        "[::1]6379", "[fe80::1%eth0]:6379", "[::g]:6379", "unix:", "unix:redis.sock", "unix:./redis.sock",
        "unix:~/redis.sock", "local host:6379", " localhost:6379", "localhost :6379", "localhost: 6379",
        "localhost:6379 ", "redis_0:6379", "rédis:6379", "user@localhost:6379", "redis://localhost:6379",
        "localhost/0:6379", "",
    ])
    func aMalformedAddressIsRefused(text: String) {
        // User information is not quoted: it may be a password.
        let shown = text == "user@localhost:6379" ? "...@localhost:6379" : text
        #expect(
            configurationProblem(Self.json(address: text))
                == "store.address: \(JSONText.quoted(shown)) \(Self.addressProblem)")
    }

    @Test func aHostLongerThanADNSNameOrASocketPathLongerThanLinuxTakesIsRefused() throws {
        let label = String(repeating: "a", count: 63)
        let longest = [label, label, label, String(repeating: "b", count: 61)].joined(separator: ".")
        #expect(longest.utf8.count == 253)
        #expect(try address(longest + ":6379") == .tcp(host: longest, port: 6379))
        #expect(
            configurationProblem(Self.json(address: longest + "b:6379"))
                == "store.address: \(JSONText.quoted(longest + "b:6379")) \(Self.addressProblem)")

        let path = "/" + String(repeating: "s", count: 106)
        #expect(path.utf8.count == ListenAddress.maximumUnixPathBytes)
        #expect(try address("unix:" + path) == .unix(path))
        #expect(
            configurationProblem(Self.json(address: "unix:" + path + "s"))
                == "store.address: \(JSONText.quoted("unix:" + path + "s")) \(Self.addressProblem)")
    }

    /// A path hiredis would cut at its first NUL names another socket than the one configured:
    /// refused, as a listener's Unix socket (`ListenAddress`) and every file path are.
    @Test func aSocketPathWithANULIsRefused() {
        #expect(
            configurationProblem(Self.json(#""address": "unix:/run/redis.sock\u0000x", "keyFile": "k""#))
                == "store.address: \"unix:/run/redis.sock\\u0000x\" \(Self.addressProblem)")
    }

    @Test func theAddressAndTheKeyFileAreRequired() {
        let missing = "store.address: is required: host:port or unix:/path, such as 127.0.0.1:6379"
        #expect(configurationProblem(Self.json(#""keyFile": "/k""#)) == missing)
        #expect(
            configurationProblem(Self.json(#""address": null, "keyFile": "/k""#))
                == "store.address: is null; leave the key out for its default, or give a value")
        #expect(configurationProblem(#"{"store": {"type": "redis"}}"#) == missing)
        #expect(
            configurationProblem(#"{"store": {"type": "redis", "url": "redis://localhost"}}"#) == missing,
            "no url: an address")
        #expect(
            configurationProblem(Self.json(#""address": 6379, "keyFile": "/k""#))
                == "store.address: must be a string, not a number")

        let keyFile = "store.keyFile: is required: a path without NUL, such as /etc/token-broker/store.key"
        #expect(configurationProblem(Self.json(#""address": "127.0.0.1:6379""#)) == keyFile)
        #expect(configurationProblem(Self.json(#""address": "127.0.0.1:6379", "keyFile": """#)) == keyFile)
        #expect(configurationProblem(Self.json(#""address": "127.0.0.1:6379", "keyFile": "/k\u0000""#)) == keyFile)
        #expect(
            configurationProblem(Self.json(#""address": "127.0.0.1:6379", "keyFile": null"#))
                == "store.keyFile: is null; leave the key out for its default, or give a value")
    }

    @Test func theDatabaseIsZeroToTenThousand() throws {
        #expect(try settings(Self.json(address: "h:1", #", "database": 0"#))?.database == 0)
        #expect(try settings(Self.json(address: "h:1", #", "database": 10000"#))?.database == 10_000)
        for (value, shown) in [("-1", "-1"), ("10001", "10001")] {
            #expect(
                configurationProblem(Self.json(address: "h:1", #", "database": "# + value))
                    == "store.database: \(shown) is out of range; allowed: 0–10000")
        }
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "database": 1.5"#))
                == "store.database: must be a whole number in 0–10000, not 1.5")
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "database": "3""#))
                == "store.database: must be a whole number in 0–10000, not a string")
    }

    @Test func theLeaseIsOneHundredMillisecondsToTenMinutes() throws {
        #expect(try settings(Self.json(address: "h:1", #", "leaseMsec": 100"#))?.leaseMsec == 100)
        #expect(try settings(Self.json(address: "h:1", #", "leaseMsec": 600000"#))?.leaseMsec == 600_000)
        for value in ["99", "600001", "0", "-5"] {
            #expect(
                configurationProblem(Self.json(address: "h:1", #", "leaseMsec": "# + value))
                    == "store.leaseMsec: \(value) is out of range; allowed: 100–600000")
        }
    }

    @Test func theTimeoutIsTenMillisecondsToAMinute() throws {
        #expect(try settings(Self.json(address: "h:1", #", "timeoutMsec": 10"#))?.timeoutMsec == 10)
        #expect(try settings(Self.json(address: "h:1", #", "timeoutMsec": 60000"#))?.timeoutMsec == 60_000)
        for value in ["9", "60001", "0"] {
            #expect(
                configurationProblem(Self.json(address: "h:1", #", "timeoutMsec": "# + value))
                    == "store.timeoutMsec: \(value) is out of range; allowed: 10–60000")
        }
    }

    @Test func aUsernameNeedsAPasswordFile() throws {
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "username": "broker""#))
                == "store.username: needs passwordFile")
        let both = try settings(Self.json(address: "h:1", #", "username": "broker", "passwordFile": "/run/pw""#))
        #expect(both?.username == "broker")
        #expect(both?.passwordFile == "/run/pw")
        let passwordOnly = try settings(Self.json(address: "h:1", #", "passwordFile": "/run/pw""#))
        #expect(passwordOnly?.username == nil, "AUTH with the password alone")
        #expect(passwordOnly?.passwordFile == "/run/pw")
    }

    @Test func aUsernameIsVisibleASCIIWithoutSpaces() {
        for username in ["", "bro ker", "bröker", "tab\\tbed"] {
            #expect(
                configurationProblem(
                    Self.json(address: "h:1", #", "username": ""# + username + #"", "passwordFile": "/run/pw""#))
                    == "store.username: must be visible ASCII without spaces", "\(username)")
        }
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "username": 7, "passwordFile": "/run/pw""#))
                == "store.username: must be a string, not a number")
    }

    @Test func aPasswordFileIsAPathWithoutNUL() {
        let problem = "store.passwordFile: must be a path without NUL, such as /run/secrets/redis"
        #expect(configurationProblem(Self.json(address: "h:1", #", "passwordFile": """#)) == problem)
        #expect(configurationProblem(Self.json(address: "h:1", #", "passwordFile": "/run/p\u0000w""#)) == problem)
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "passwordFile": true"#))
                == "store.passwordFile: must be a string, not a boolean")
    }

    @Test func aKeyPrefixIsOneTo128VisibleASCIICharacters() throws {
        #expect(try settings(Self.json(address: "h:1", #", "keyPrefix": "x""#))?.keyPrefix == "x")
        let longest = String(repeating: "p", count: 128)
        #expect(try settings(Self.json(address: "h:1", #", "keyPrefix": ""# + longest + #"""#))?.keyPrefix == longest)
        #expect(
            try settings(Self.json(address: "h:1", #", "keyPrefix": "{tb}:prod/1~""#))?.keyPrefix == "{tb}:prod/1~",
            "punctuation, a cluster hash tag")
        let problem = "store.keyPrefix: must be 1–128 visible ASCII characters, such as token-broker:"
        for prefix in ["", "token broker:", "préfixe:", "tab\\t:", "new\\nline:", longest + "p"] {
            #expect(
                configurationProblem(Self.json(address: "h:1", #", "keyPrefix": ""# + prefix + #"""#)) == problem,
                "\(prefix)")
        }
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "keyPrefix": ["a"]"#))
                == "store.keyPrefix: must be a string, not an array")
    }

    @Test func anUnknownKeyIsNamedWithTheAllowedOnes() {
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "url": "redis://h:1""#))
                == "store.url: unknown key; allowed: \(Self.allowedKeys)")
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "password": "hunter2""#))
                == "store.password: unknown key; allowed: \(Self.allowedKeys)", "a password is a file's, never inline")
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "path": "/var/lib/tb""#))
                == "store.path: unknown key; allowed: \(Self.allowedKeys)", "a file store's key")
        #expect(
            configurationProblem(#"{"store": {"type": "file", "path": "/p", "keyFile": "/k", "address": "h:1"}}"#)
                == "store.address: unknown key; allowed: type, path, keyFile", "a redis key in a file store")
    }

    /// The list of allowed keys names each key once, whichever keys the configuration has.
    @Test func theAllowedKeysAreTheSameWithAPasswordFile() {
        #expect(
            configurationProblem(Self.json(address: "h:1", #", "passwordFile": "/run/pw", "ttl": 5"#))
                == "store.ttl: unknown key; allowed: \(Self.allowedKeys)")
    }

    @Test func aStoreTypeOtherThanTheLowercaseNameIsRefused() {
        #expect(
            configurationProblem(#"{"store": {"type": "Redis", "address": "h:1", "keyFile": "/k"}}"#)
                == #"store.type: "Redis" is not a store; allowed: "memory", "file", "redis""#)
    }

    @Test func relativeFilesAreResolvedAgainstTheConfigurationFilesDirectory() throws {
        var configuration = try BrokerConfiguration(
            json: Array(
                Self.json(#""address": "127.0.0.1:6379", "keyFile": "keys/store.key", "passwordFile": "redis.pw""#)
                    .utf8))
        configuration.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "/etc/tb/config.json"))
        guard case .redis(let settings) = configuration.store else {
            Issue.record("expected a redis store")
            return
        }
        #expect(settings.keyFile == "/etc/tb/keys/store.key")
        #expect(settings.passwordFile == "/etc/tb/redis.pw")
        #expect(settings.address == .tcp(host: "127.0.0.1", port: 6379), "a TCP address is no path")
        #expect(configuration.store.secretFiles == ["/etc/tb/keys/store.key", "/etc/tb/redis.pw"])

        var absolute = try BrokerConfiguration(
            json: Array(
                Self.json(
                    #""address": "unix:/run/redis/redis.sock", "keyFile": "/srv/store.key", "passwordFile": "pw""#
                )
                .utf8))
        absolute.resolvePaths(relativeTo: "/etc/tb")
        guard case .redis(let kept) = absolute.store else {
            Issue.record("expected a redis store")
            return
        }
        #expect(kept.address == .unix("/run/redis/redis.sock"), "a socket path is absolute, and kept")
        #expect(kept.keyFile == "/srv/store.key", "absolute paths are kept")
        #expect(kept.passwordFile == "/etc/tb/pw")

        var here = try BrokerConfiguration(
            json: Array(Self.json(#""address": "h:1", "keyFile": "store.key""#).utf8))
        here.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "config.json"))
        guard case .redis(let local) = here.store else {
            Issue.record("expected a redis store")
            return
        }
        #expect(local.keyFile == "store.key", "a file in the working directory")
        #expect(local.passwordFile == nil)
    }

    /// A socket path is never relative: the working directory would decide which Redis it is,
    /// so the configuration's directory cannot resolve it either.
    @Test func aRelativeSocketPathIsRefusedRatherThanResolved() {
        #expect(
            configurationProblem(Self.json(#""address": "unix:run/redis.sock", "keyFile": "store.key""#))
                == "store.address: \"unix:run/redis.sock\" \(Self.addressProblem)")
    }
}
