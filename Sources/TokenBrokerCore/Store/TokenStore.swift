/// Where a provider keeps its token beyond its own memory, so that it outlives a restart.
///
/// The provider reads its record once, when it starts, before it fetches anything, and hands
/// each new token to `save` after the fetch that brought it. A store seals what it keeps
/// (`TokenBrokerStore`'s records are AES-256-GCM under a key of the operator's): it never holds
/// a token in clear, nor any client secret, since a record holds only what `/token` would show.
///
/// - Important: no call may wait on the caller's thread for I/O that can stall: `load`
///   suspends while the store reads, and `save` and `forget` hand their work to the store's own
///   thread.
public protocol TokenStore: Sendable {
    /// The record kept under `key`, or why there is none to use.
    func load(_ key: String) async -> StoreLoad
    /// Keeps `record` under `key`, replacing what was there; returns at once.
    func save(_ key: String, _ record: StoredToken)
    /// Nobody here needs the record under `key` any more (a template's child was dropped, and has
    /// ended): a store may remove it once its token has expired, unless `key` is saved again
    /// first; returns at once. A store shared with other brokers keeps it (they may still read it).
    func forget(_ key: String)
}

extension TokenStore {
    /// Keeps the record: for stores that other brokers share (Redis, whose records expire with
    /// their tokens, or a day after their last write for a token without expiry), and stores of tests.
    public func forget(_ key: String) {}
}

/// A token as a store keeps it: what `/token` shows of it, with its version, dated by the wall
/// clock (a restart loses the monotonic clock, so a record cannot be dated on it).
public struct StoredToken: Sendable, Equatable {
    public var accessToken: String
    public var tokenType: String
    public var scope: String?
    /// The provider's version of the token, kept across a restart.
    public var version: UInt64
    /// When it was fetched.
    public var issuedAt: WallTime
    /// When it stops being valid; nil for a token without expiry.
    public var expiresAt: WallTime?
    /// A digest of the provider's settings when it was made (`StoreSlot.settings`).
    public var settings: String

    public init(
        accessToken: String, tokenType: String, scope: String?, version: UInt64, issuedAt: WallTime,
        expiresAt: WallTime?, settings: String = ""
    ) {
        self.settings = settings
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.scope = scope
        self.version = version
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
    }

    /// The record of a token the provider holds, made under `settings`.
    public init<Instant>(_ token: CachedToken<Instant>, settings: String = "") {
        self.init(
            accessToken: token.token.accessToken, tokenType: token.token.tokenType, scope: token.token.scope,
            version: token.version, issuedAt: token.issuedAtDate, expiresAt: token.expiresAtDate, settings: settings)
    }

    /// How far a record's expiry may lie past what a store's clock gives it and still be left as
    /// written (`placed`): a record and Redis each count whole milliseconds, so a record from a
    /// clock that agrees with this host's is a millisecond or two out; a clock that runs ahead
    /// by less than this serves its tokens that much past their expiry at most.
    public static let placingSlack: Duration = .milliseconds(100)

    /// Whether it may still be handed out at `now`.
    public func isValid(at now: WallTime) -> Bool { expiresAt.map { now < $0 } ?? true }

    /// The record with its dates placed by a store's own clock, which said, when it was asked at
    /// `asked` on this host's wall clock, that the record has `left` to live (Redis: its key's
    /// `PTTL`, set from the token's lifetime when it was written, and counted down by Redis).
    ///
    /// A record is dated by the wall clock of the broker that wrote it. When that clock ran
    /// ahead of this one's, the record's expiry lies past what the store gives it, by as much:
    /// both dates move back by the difference, so that the token is served until it expires and
    /// no longer, and is refreshed where its lifetime puts the refresh from its issue. Within
    /// `placingSlack` of what the store gives (whole milliseconds on both sides), a record is left
    /// as written. A record whose expiry is nearer than the store says (a writer whose clock ran
    /// behind) is left too: served for less, never more. A token without expiry has nothing to move.
    public func placed(expiringWithin left: Duration, askedAt asked: WallTime) -> StoredToken {
        guard let expiresAt else { return self }
        let latest = asked.addingTimeInterval(max(0, left.inSeconds))
        let ahead = expiresAt.timeIntervalSince(latest)
        guard ahead > Self.placingSlack.inSeconds else { return self }
        var placed = self
        placed.issuedAt = issuedAt.addingTimeInterval(-ahead)
        placed.expiresAt = latest
        return placed
    }
}

/// What a store found under a key.
public enum StoreLoad: Sendable, Equatable {
    /// A record, authenticated and readable. It may have expired since: the provider checks.
    case found(StoredToken)
    /// Nothing is kept under the key.
    case missing
    /// Something is kept but may not be used: it failed to authenticate (another key, another
    /// provider's record, a changed byte), or it cannot be read. The reason never quotes the record.
    case refused(String)
}

/// A store and the key a provider's record has in it: the provider's name, and for a template's
/// child its values too (`key(provider:values:)`).
public struct StoreSlot: Sendable {
    public let store: any TokenStore
    public let key: String
    /// A digest of the settings that decide which token the provider gets (its source's
    /// `storeIdentity`, its signing key, its credential files' contents): a record made under
    /// other settings is not served, since an operator who changed the issuer, the scope or the
    /// key wants tokens of the new ones, and a broker holding other credentials (another API key
    /// at the same path) must not serve the tokens fetched with these.
    public let settings: String

    public init(store: any TokenStore, key: String, settings: String = "") {
        self.store = store
        self.key = key
        self.settings = settings
    }

    /// The key of a provider's record, or of a template's child's: the name, then each value the
    /// child names on a line of its own. Values are visible ASCII (the scope's spaces aside), so
    /// no two children share a key.
    public static func key(provider: String, values: TokenRequestValues = .none) -> String {
        var key = provider
        for parameter in RequestParameter.allCases {
            if let value = values.value(parameter) { key += "\n\(parameter.rawValue)=\(value)" }
        }
        return key
    }
}

/// A store that brokers on many hosts share, so that one fetch per refresh serves the fleet.
///
/// A provider with such a store fetches through `fetchForFleet` instead of calling its source:
/// the store finds a newer record another broker stored, or takes the refresh lease and fetches
/// (with the source) for everyone, or, when the store is out of reach, lets the provider fetch
/// alone. It also tells the provider of each record another broker stores (`watch`), so that
/// waiting requests everywhere are answered moments after one broker fetched.
public protocol SharedTokenStore: TokenStore {
    /// A fetch for the fleet.
    /// - Parameters:
    ///   - key: the record's key (`StoreSlot.key`); `settings`: the provider's (`StoreSlot.settings`).
    ///   - current: the highest version the provider handed out or numbers after (0: none): a
    ///     record must be newer to answer, and a token fetched here is numbered after it, so that
    ///     every broker serves one token under one version.
    ///   - forced: a forced refresh asked for it (the retrier); the other brokers are told, and
    ///     count it in their windows.
    ///   - waiting: what bounds this broker's wait for another's record (`FleetWait`).
    ///   - accepts: whether the provider may serve a record another broker stored (its rules
    ///     may differ from theirs); one it refuses is fetched past, as if older.
    ///   - fetch: the provider's source, called only when this broker is the one to fetch.
    func fetchForFleet(
        _ key: String, settings: String, current: UInt64, forced: Bool, waiting: FleetWait,
        accepts: @escaping @Sendable (StoredToken) -> Bool,
        fetch: @escaping @Sendable () async throws(TokenFetchError) -> FetchedToken
    ) async -> Result<SharedFetch, TokenFetchError>

    /// Calls `onRecord`, on a thread of the store's, with each record stored under `key` by
    /// another broker (made under `settings`), and whether a forced refresh fetched it, until
    /// `stopWatching` with the id returned.
    func watch(_ key: String, settings: String, _ onRecord: @escaping @Sendable (StoredToken, _ forced: Bool) -> Void)
        -> UInt64
    func stopWatching(_ key: String, id: UInt64)
}

/// What a provider tells a fetch for the fleet of its own deadlines, measured when it asks:
/// they bound how long the store waits on a lease another holds before it fetches alone, or
/// gives up with a failure that says so (`RedisTokenStore.fetchForFleet`).
public struct FleetWait: Sendable, Equatable {
    /// What the valid token the provider holds has left; nil: none held, or one without expiry.
    public var tokenLeft: Duration?
    /// What the fetch has left before its deadline (`fetchTimeoutSec`); nil: no deadline.
    public var fetchLeft: Duration?

    public init(tokenLeft: Duration? = nil, fetchLeft: Duration? = nil) {
        self.tokenLeft = tokenLeft
        self.fetchLeft = fetchLeft
    }
}

/// How a fetch for the fleet ended.
public struct SharedFetch: Sendable {
    /// Who fetched the record's token.
    public enum Origin: Sendable, Equatable {
        /// This broker, holding the lease: the record is stored for the fleet.
        case fetchedForFleet
        /// This broker, without the store (out of reach): the record is its own.
        case fetchedAlone
        /// Another broker: this one fetched nothing.
        case fromFleet
    }

    public let record: StoredToken
    public let origin: Origin
    /// What the source said, when this broker fetched (its upstream status, for metrics).
    public let fetched: FetchedToken?

    public init(record: StoredToken, origin: Origin, fetched: FetchedToken?) {
        self.record = record
        self.origin = origin
        self.fetched = fetched
    }
}
