import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSinks
import TokenBrokerSources
import TokenBrokerStore

/// The token store (`store`): the steps `Broker.run` and `Broker.stop` take for it.
///
/// In `run`: `openStore` after the configuration is read (a key file without a key, a directory
/// that cannot hold records, an unreadable Redis password file, exits 2, "invalid
/// configuration"); each provider and template child is then made with its slot in the store
/// (`storeSlot`), reads its record when it starts, and keeps each new token there. In `stop`:
/// `closeStore` once the providers have ended, so that a record being written is whole before
/// the process exits.
extension Broker {
    /// The configured store, opened.
    enum OpenedStore: Sendable {
        case file(FileTokenStore)
        case redis(RedisTokenStore)

        var tokenStore: any TokenStore {
            switch self {
            case .file(let store): store
            case .redis(let store): store
            }
        }
    }

    /// The configured store, opened: nil for `memory`.
    static func openStore(_ configuration: BrokerConfiguration, metrics: BrokerMetrics?, connect: Bool = true)
        -> Result<OpenedStore?, ConfigurationError>
    {
        let keyFile: String
        switch configuration.store {
        case .memory: return .success(nil)
        case .file(_, let file): keyFile = file
        case .redis(let settings): keyFile = settings.keyFile
        }
        let cipher: AESGCM
        switch StoreKeyFile.read(keyFile) {
        case .success(let read): cipher = read
        case .failure(let problem): return .failure(ConfigurationError(key: "store.keyFile", problem.description))
        }
        switch configuration.store {
        case .memory:
            return .success(nil)
        case .file(let path, _):
            let directory: SinkDirectory
            switch SinkDirectory.open(path) {
            case .success(let opened): directory = opened
            case .failure(let problem): return .failure(ConfigurationError(key: "store.path", problem.description))
            }
            // Checked as a token file's directory is, ACLs included.
            if let problem = aclProblem(directory, holding: "record") {
                return .failure(ConfigurationError(key: "store.path", problem))
            }
            // And a record can be written there: a probe file is made and removed.
            if let problem = directory.creationProblem(holding: "record") {
                return .failure(ConfigurationError(key: "store.path", problem))
            }
            return .success(
                .file(
                    FileTokenStore(
                        directory: directory, cipher: cipher,
                        onSave: { key, problem in
                            metrics?.recordStoreOperation("save", result: problem == nil ? "ok" : "error")
                            if let problem { logStoreProblem("token not stored", key: key, problem: problem) }
                        },
                        onRemove: { key, problem in
                            metrics?.recordStoreOperation("remove", result: problem == nil ? "ok" : "error")
                            if let problem {
                                logStoreProblem("dropped child's record not removed", key: key, problem: problem)
                            }
                        })))
        case .redis(let settings):
            let password: String?
            switch redisPassword(settings) {
            case .success(let read): password = read
            case .failure(let problem): return .failure(problem)
            }
            guard connect else { return .success(nil) }
            var events = RedisTokenStore.Events()
            events.operation = { operation, result in metrics?.recordStoreOperation(operation, result: result) }
            events.message = { metrics?.recordStoreOperation("message", result: "received") }
            events.notStored = { key, problem in logStoreProblem("token not stored", key: key, problem: problem) }
            events.reachability = { problem in
                if let problem {
                    Log.warning(
                        "token store out of reach; fetching alone until it answers",
                        ["address": settings.address.description, "problem": problem])
                } else {
                    Log.info("token store reachable", ["address": settings.address.description])
                }
            }
            events.lease = { key, problem in
                if let problem {
                    logStoreProblem(
                        "a lease the broker did not take holds up the fleet; fetching alone", key: key, problem: problem
                    )
                } else {
                    let (provider, values) = describe(key)
                    if let values {
                        Log.info(
                            "the lease that held up the fleet has ended", ["provider": provider, "values": values])
                    } else {
                        Log.info("the lease that held up the fleet has ended", ["provider": provider])
                    }
                }
            }
            do {
                let store = try RedisTokenStore(settings: settings, password: password, cipher: cipher, events: events)
                metrics?.observeStoreHealth {
                    let health = store.currentHealth
                    return (health.reachable, health.lastReachable.map { $0.duration(to: .now).inSeconds })
                }
                return .success(.redis(store))
            } catch {
                return .failure(ConfigurationError(key: "store", error.summary))
            }
        }
    }

    /// The Redis password in `passwordFile`, as the store logs in with it: the file's text, a
    /// final newline dropped; nil without a password file. A file that cannot be read, or holds
    /// nothing else, is a configuration error naming `store.passwordFile`.
    static func redisPassword(_ settings: RedisStoreSettings) -> Result<String?, ConfigurationError> {
        guard let path = settings.passwordFile else { return .success(nil) }
        switch FileContents.read(path, limit: 4096) {
        case .success(let bytes):
            var text = String(decoding: bytes, as: UTF8.self)
            while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
            guard !text.isEmpty else {
                return .failure(ConfigurationError(key: "store.passwordFile", "\(path) is empty"))
            }
            return .success(text)
        case .failure(let error):
            return .failure(ConfigurationError(key: "store.passwordFile", "cannot read \(path): \(error)"))
        }
    }

    /// The digest of the Redis password the store logs in with (`redisPassword`); nil without a
    /// Redis store, without a password file, or when it cannot be read. The store reads the
    /// password once, at start, and keeps it for every connection until a restart: a reload that
    /// finds another one in the file is refused, as one that finds another key is.
    static func storePasswordDigest(_ configuration: BrokerConfiguration) -> [UInt8]? {
        guard case .redis(let settings) = configuration.store, case .success(let password?) = redisPassword(settings)
        else { return nil }
        return try? Crypto.sha256(Array(password.utf8))
    }

    /// The digest of the key in the store's key file (`StoreKeyFile.digest`); nil without a store
    /// key, or when the file holds none.
    static func storeKeyDigest(_ configuration: BrokerConfiguration) -> [UInt8]? {
        switch configuration.store {
        case .memory: nil
        case .file(_, let keyFile): StoreKeyFile.digest(keyFile)
        case .redis(let settings): StoreKeyFile.digest(settings.keyFile)
        }
    }

    /// The slot of a provider, or of a template's child for `values`, in `store`; nil for a
    /// provider whose tokens are not stored (`isStored`).
    /// - Parameters:
    ///   - signer: the provider's local signer, whose key is part of the settings a record must
    ///     have been made under.
    ///   - credentials: the digests of the source's `credentialFiles` (`credentialDigests`), read
    ///     at start or at the reload that made the provider: part of those settings too.
    static func storeSlot(
        _ store: OpenedStore?, provider: ProviderConfiguration, signer: JWTSigner?, credentials: [[UInt8]?],
        values: TokenRequestValues = .none
    ) -> StoreSlot? {
        guard let store, isStored(provider) else { return nil }
        return StoreSlot(
            store: store.tokenStore, key: StoreSlot.key(provider: provider.name, values: values),
            settings: settingsDigest(provider.source, signer: signer, credentials: credentials))
    }

    /// The digest of the settings a provider's records are made under (`StoreSlot.settings`): its
    /// source's `storeIdentity`, its local signer's key, so that any key change, a rotated HS256
    /// secret included, refuses the records made under the old one, then the digest of each of
    /// its credential files (`credentials`), so that a broker whose secret file holds another API
    /// key, client secret, private key or certificate at the same path (another tenant's, a
    /// rotated one) refuses them too, and is refused by the others.
    ///
    /// The key is named by its public JWK (ES256, RS256), not only by its key id, which a
    /// configuration may fix. An HS256 secret has no public JWK (its JWKS is empty): it is named
    /// by its thumbprint, the first 16 bytes of SHA-256(SHA-256(secret)), the `kid` its tokens
    /// carry when none is configured, never by the secret. A credential file is named by the
    /// SHA-256 of its contents, inside this digest, never by itself; a file that could not be read
    /// (nil) by `unreadableCredential`, which no other process shares. Only this digest leaves
    /// the process, kept sealed in the record.
    static func settingsDigest(_ source: SourceConfiguration, signer: JWTSigner?, credentials: [[UInt8]?])
        -> String
    {
        var identity = source.storeIdentity + "\n" + (signer.map { JWTSigner.jwks([$0]) } ?? "")
        if let signer, signer.publicJWK == nil { identity += "\nsecret=" + signer.key.thumbprint() }
        for digest in credentials {
            identity += "\nfile=" + (digest.map { Fingerprint.hex($0) } ?? unreadableCredential)
        }
        return (try? Fingerprint.sha256Hex(identity)) ?? identity
    }

    /// What names a credential file that could not be read when the provider was made (a header
    /// file mounted later, say): random, this process's own. The provider's fetches read the file
    /// then, and would put whatever it then holds behind the identity of a file nobody could read;
    /// so such a provider shares its records with no other broker, nor with its own next start,
    /// until a reload or a restart reads the file.
    static let unreadableCredential =
        "unreadable:" + Fingerprint.hex((0..<16).map { _ in UInt8.random(in: .min ... .max) })

    /// SHA-256 of each of the provider's credential files (`SourceConfiguration.credentialFiles`:
    /// keys, secrets, client certificates; nil for one that cannot be read), in that order. Taken
    /// at start and at each reload before the sources read the files: a reload compares them (a
    /// key read once at start changes only through a replacement), and the store's records carry
    /// them (`settingsDigest`).
    static func credentialDigests(_ settings: ProviderConfiguration) -> [[UInt8]?] {
        settings.source.credentialFiles.map { path -> [UInt8]? in
            guard case .success(let contents) = FileContents.read(path) else { return nil }
            return try? Crypto.sha256(contents)
        }
    }

    /// Whether a provider's tokens are kept in the store. Not:
    /// - a local signer's whose key is generated at start, since the next process signs with
    ///   another key and no reader of its JWKS could verify a token kept from the last;
    /// - a `file` source's: its token is this host's file, read again at every refresh for the
    ///   cost of a read. A record of it would be served where that file is not (by another host's
    ///   broker sharing a Redis store: another pod's projected service-account token, bound to
    ///   that pod), or in place of what the file holds now; and nothing names the file across
    ///   hosts but its path, which every host has (`SourceConfiguration.storeIdentity`).
    static func isStored(_ provider: ProviderConfiguration) -> Bool {
        switch provider.source {
        case .jwt(let settings): settings.keyFile != nil
        case .file: false
        case .oauth2, .http: true
        }
    }

    /// Says which providers the store leaves out, and why; and, with Redis, which providers'
    /// fetches may outlast the lease (another broker could then fetch too).
    static func logStoreWarnings(_ configuration: BrokerConfiguration) {
        guard configuration.store != .memory else { return }
        for provider in configuration.providers where !isStored(provider) {
            if case .file = provider.source {
                Log.info(
                    "tokens not stored: a file source reads this host's token file at each refresh",
                    ["provider": provider.name])
            } else {
                Log.info(
                    "tokens not stored: the local signer's key is generated at start (set keyFile to keep them)",
                    ["provider": provider.name])
            }
        }
        guard case .redis(let settings) = configuration.store else { return }
        for provider in configuration.providers {
            // An issuer's exchange ends by its upstream timeout; a local signer's or a file's at once.
            let exchange: Int
            switch provider.source {
            case .oauth2(let source): exchange = source.upstream.timeoutMsec
            case .http(let source): exchange = source.upstream.timeoutMsec
            case .jwt, .file: continue
            }
            guard exchange > settings.leaseMsec else { continue }
            Log.warning(
                "a fetch may outlast the fleet's lease, and another broker fetch too (raise store.leaseMsec)",
                ["provider": provider.name, "timeoutMsec": String(exchange), "leaseMsec": String(settings.leaseMsec)])
        }
    }

    /// What `/readyz` says of the store.
    static func storeReport(_ store: OpenedStore?) -> AdminAPI.StoreReport? {
        switch store {
        case .file: AdminAPI.StoreReport(type: "file", problem: nil)
        case .redis(let store):
            // Out of reach, or a lease that outlives any this broker takes (reachable all the same).
            AdminAPI.StoreReport(type: "redis", problem: store.currentHealth.problem)
        case nil: nil
        }
    }

    /// Ends the store's work: the file store's writes under way, the Redis store's subscriber and
    /// connections; the last step of `stop`.
    static func closeStore(_ store: OpenedStore?) {
        switch store {
        case .file(let store): store.flush()
        case .redis(let store): store.stop()
        case nil: break
        }
    }

    /// Logs a store's problem with a record, naming its provider and the child's values.
    private static func logStoreProblem(_ message: String, key: String, problem: String) {
        let (provider, values) = describe(key)
        if let values {
            Log.warning(message, ["provider": provider, "values": values, "problem": problem])
        } else {
            Log.warning(message, ["provider": provider, "problem": problem])
        }
    }

    /// A record's key for the log: the provider, and a child's values (nil for a provider's own).
    private static func describe(_ key: String) -> (provider: String, values: String?) {
        let lines = key.split(separator: "\n", omittingEmptySubsequences: false)
        return (String(lines.first ?? ""), lines.count > 1 ? lines.dropFirst().joined(separator: " ") : nil)
    }
}
