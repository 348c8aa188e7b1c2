import Dispatch
import Glibc
import Synchronization
import TokenBrokerCore
import TokenBrokerCrypto

/// The `redis` store: brokers on many hosts share their tokens through Redis, and one of them
/// fetches for all at each refresh.
///
/// Keys, under `keyPrefix` (`P`), for a record key `K` (`StoreSlot.key`) whose SHA-256 in hex is `H`:
///
/// | key | holds | lives |
/// |---|---|---|
/// | `P record:H` | the sealed record (`StoreRecord`) | until the token expires (`PX`); without expiry, a day after its last write |
/// | `P lease:H` | the id of the broker fetching for the fleet | `leaseMsec` (`SET NX PX`) |
/// | `P fence:H` | a counter, one more for each lease taken | a day after the last lease |
/// | channel `P records` | `H` then the sealed record, for each record stored | |
///
/// Every record read from Redis is read with its key's time to live, by which its dates are
/// placed (`opened`): a record from a broker whose clock runs ahead is not served past its expiry.
///
/// A fetch for the fleet (`fetchForFleet`): a newer record, valid and made under the same
/// settings, answers at once; else the broker takes the lease (a small script: `SET NX PX`, then
/// `INCR` of the fence) and fetches, then stores the record with a second script that checks the
/// fence is still its own (a broker whose lease ran out and was taken over cannot overwrite a newer
/// record), publishes it, and lets the lease go. Brokers that find the lease taken wait for the
/// record (the channel wakes them) or for the lease to end, then try again. A failed fetch keeps
/// the lease, not extended: its holder retries under it on its backoff while it lasts, and the
/// others wait, so a failing issuer sees one broker's retries, not the fleet's; once it lapses,
/// whichever broker asks first fetches. No broker waits on a lease longer than its own
/// `leaseMsec`, counted from when it first found that lease (a lease its holder takes again
/// after the last lapsed is another: `LeaseWait.isSameLease`); and a lease that outlives
/// that (one this broker could not have taken) is waited on for half of what the provider's token
/// has left at most, then the broker fetches alone, so that no token expires for it (`FleetWait`,
/// `leaseOutlives`).
///
/// A key of another type than a string under the store's names, or a fence counter that is not a
/// whole number written in digits, is one key Redis refuses for the fleet (`refused`): its
/// provider fetches alone until the key is deleted; the error reply (`WRONGTYPE`) is an answer,
/// which neither drops the connection nor touches the other keys (`isAboutOneKey`).
///
/// Every call to Redis runs on the store's own queue (`RedisCallQueue`), never on a server thread
/// (the request path never calls Redis: `/token` reads the provider's memory), and is answered
/// within `timeoutMsec` of being asked, its wait for its turn included. A call that fails marks
/// the store out of reach: fetches then go to the issuer alone, as without a store, and the store
/// tries Redis again at most once a second, and rejoins when it answers. A call that runs out of
/// time, waiting or running, finds Redis slow, which is out of reach too: for a second, every call
/// is answered at once without touching Redis, so that the calls behind it do not each wait
/// their `timeoutMsec` in turn. The subscriber has a connection and a thread of its own.
public final class RedisTokenStore: SharedTokenStore {
    /// What the store reports, for logs and metrics.
    public struct Events: Sendable {
        /// An operation (`load`, `lease`, `write`, `get`) and its result.
        public var operation: @Sendable (_ operation: String, _ result: String) -> Void = { _, _ in }
        /// A record arrived on the channel.
        public var message: @Sendable () -> Void = {}
        /// Redis became reachable (nil) or out of reach (why).
        public var reachability: @Sendable (_ problem: String?) -> Void = { _ in }
        /// A lease this broker did not take outlives any it takes, and holds up the record under
        /// `key` (why, naming the lease's key, never its holder); nil: it no longer does.
        public var lease: @Sendable (_ key: String, _ problem: String?) -> Void = { _, _ in }
        /// A record was not stored, for a reason of its own, not Redis's (too large to seal): its
        /// key, and why, in words that never quote the token.
        public var notStored: @Sendable (_ key: String, _ problem: String) -> Void = { _, _ in }
        public init() {}
    }

    /// Whether Redis answers, for `/readyz` and the metrics.
    public struct Health: Sendable {
        /// Redis answers, and refuses no key the fleet needs.
        public var reachable: Bool
        /// When Redis last answered, on the monotonic clock; nil: never.
        public var lastReachable: ContinuousClock.Instant?
        /// Why the broker fetches alone for some or all of its providers (nil: it does not): why
        /// the store is out of reach, else a lease that outlives any this broker takes.
        public var problem: String?
    }

    private let settings: RedisStoreSettings
    private let password: String?
    private let record: StoreRecord
    private let events: Events
    /// This broker's id in the leases it takes.
    private let owner: [UInt8]
    private let channel: [UInt8]
    private let calls = RedisCallQueue(label: "token-broker.store.redis")
    private let subscriber = DispatchQueue(label: "token-broker.store.redis.subscriber")
    /// Looks up the host's name for both connections, within their calls' deadlines.
    private let resolver: RedisHostResolver?

    /// The command connection. Unchecked: it is touched only on `calls`' queue, one call at a time.
    private struct Link: @unchecked Sendable {
        var connection: RedisConnection?
        var lastAttempt: ContinuousClock.Instant?
    }

    private struct Watcher {
        let key: String
        let settings: String
        let onRecord: @Sendable (StoredToken, Bool) -> Void
    }

    /// A lease another holder keeps, which this broker has been waiting on (`fetchForFleet`).
    private struct LeaseWait {
        /// SHA-1 of the holder's id, in hex, as the lease script answers it.
        let holder: [UInt8]
        /// When this broker first found that lease.
        let since: ContinuousClock.Instant
        /// The latest the lease can end, by what it had left when first found.
        let endsBy: ContinuousClock.Instant

        /// Whether a lease of `holder` found with `left` after a call asked at `asked` is this
        /// one: the same holder, and no end later than this one's. A holder takes a lease again
        /// only once its last has lapsed (its retries under a lease do not extend it), so its
        /// next one ends at least its `leaseMsec` (100 ms or more) after `endsBy`, and is another
        /// lease to wait on: a fleet broker whose issuer fails retakes its lease at each lapse,
        /// and is waited on each time. Within a margin: Redis counts `left` in whole
        /// milliseconds, on a clock that may drift from this one's (50 ms, and 0.1 % of the wait).
        func isSameLease(_ holder: [UInt8], left: Int64, asked: ContinuousClock.Instant) -> Bool {
            let margin = Duration.milliseconds(50) + since.duration(to: asked) / 1000
            return holder == self.holder && asked.advanced(by: .milliseconds(left)) <= endsBy.advanced(by: margin)
        }
    }

    private struct Watching {
        var byHash: [String: [UInt64: Watcher]] = [:]
        var nextID: UInt64 = 0
        /// Messages seen for each hash: a broker waiting on a lease wakes when its count moves.
        var notices: [String: UInt64] = [:]
    }

    /// Touched only on `calls`' queue (the lock costs nothing there, and keeps the checker's view simple).
    private let link = Lock(Link())
    /// What each connection last found: the store is reachable while both answer. Kept apart, so
    /// that one connection answering never clears what the other found (an ACL that lets the
    /// subscriber in but refuses the scripts would otherwise flip the state at every call).
    /// `refusals` are answers the fleet cannot use (a fence counter out of range, a script's
    /// answer it cannot give), by the fence key they came for: each is kept until a script
    /// answers as it should for the same key, not cleared by a `GET` or a `PING` that succeeds
    /// meanwhile, nor by another key's lease (a key with a sound counter would otherwise flip
    /// the state at every refresh of the two). `leases` are leases that outlive any this broker
    /// takes, by the lease key: Redis answers, so they leave the store reachable, but the broker
    /// fetches alone for their providers, which `/readyz` says.
    private struct Problems {
        var commands: String?
        var subscriber: String?
        var refusals: [String: String] = [:]
        var leases: [String: String] = [:]
        var lastReachable: ContinuousClock.Instant?
        /// Until when calls are answered without touching Redis, which a call found slow.
        var quietUntil: ContinuousClock.Instant?
        /// Why the store is out of reach for the fleet; nil: it is not.
        var unreachable: String? { commands ?? subscriber ?? refusals.min { $0.key < $1.key }?.value }
        var problem: String? { unreachable ?? leases.min { $0.key < $1.key }?.value }
    }
    private let problems = Lock(Problems())
    /// The leases this broker waits on, by the record key's hash.
    private let leaseWaits = Lock([String: LeaseWait]())
    private let watching = Lock(Watching())
    private let stopping = Atomic<Bool>(false)
    /// A catch-up is queued and has not started.
    private let catchingUp = Atomic<Bool>(false)
    /// A probe of the command connection is queued and has not started.
    private let probing = Atomic<Bool>(false)
    private let subscriberEnded = DispatchSemaphore(value: 0)

    /// How many times a fetch reads a record that changed under the lease script before it waits
    /// between two looks.
    static let rereadsAtOnce = 3
    /// How long a broker waits between two looks at a lease another holds.
    private static let leasePoll: Duration = .milliseconds(250)
    /// The shortest time between two attempts to connect while Redis is out of reach.
    private static let reconnectGap: Duration = .seconds(1)
    /// The first fence the store refuses: fences run from 1 up to 999,999,999,999,999. A record's
    /// version may be its fence, and the API reads a version of at most 15 digits
    /// (`/token/refresh`'s `rejected_version`, `/token/ready`'s `after`); a counter outside the
    /// range (set by hand, say) is Redis refusing, and the broker fetches alone.
    static let fenceLimit = Int64(StoreRecord.versionLimit)
    /// How long Redis keeps the record of a token without expiry after its last write: a day, the
    /// longest `tokenRefreshDelaySec`, by when a provider that still refreshes has written it
    /// again; a record no broker writes any more (a dropped child's) then goes, as the file
    /// store's does (and a broker that starts after it went fetches, as it would have refreshed).
    static let recordLifetimeWithoutExpiry: Duration = .seconds(86_400)

    /// A store on `settings`, sealing with `cipher`; `password` from `passwordFile`, read at start.
    /// Starts its subscriber at once.
    public init(settings: RedisStoreSettings, password: String?, cipher: AESGCM, events: Events = Events())
        throws(TokenFetchError)
    {
        self.settings = settings
        self.password = password
        self.events = events
        record = StoreRecord(cipher: cipher)
        owner = Array(Fingerprint.hex(try Crypto.randomBytes(16)).utf8)
        channel = Array((settings.keyPrefix + "records").utf8)
        if case .tcp(let host, _) = settings.address {
            resolver = RedisHostResolver(host: host)
        } else {
            resolver = nil
        }
        subscriber.async { [self] in subscribe() }
    }

    /// The store's health now.
    public var currentHealth: Health {
        problems.withLock {
            Health(reachable: $0.unreachable == nil, lastReachable: $0.lastReachable, problem: $0.problem)
        }
    }

    /// Stops the subscriber and closes the connections; for the broker's stop.
    public func stop() {
        stopping.store(true, ordering: .relaxed)
        _ = subscriberEnded.wait(timeout: .now() + .seconds(2))
        calls.sync { link.withLock { $0.connection = nil } }
    }

    // MARK: - TokenStore

    public func load(_ key: String) async -> StoreLoad {
        let hash = Self.hash(key)
        let reply: RedisConnection.Reply
        switch await call({ connection throws(RedisFailure) in
            try Self.readRecord(connection, Array(self.name("record:", hash).utf8))
        }) {
        case .failure(let failure):
            // Counted and logged by the provider, as a refused load, with this reason.
            return .refused("the Redis store is out of reach: \(failure)")
        case .success(let answer):
            reply = answer
        }
        let asked = WallTime()
        // The one error reply a call answers (`isAboutOneKey`): a value of another type.
        if case .error = reply { return .refused(Self.wrongType(name("record:", hash))) }
        guard let read = RecordRead(reply) else {
            return .refused("Redis answered PTTL or GETRANGE with \(Self.describe(reply))")
        }
        guard !read.bytes.isEmpty else { return .missing }
        switch opened(read, key: key, askedAt: asked) {
        case .success(let stored): return .found(stored)
        case .failure(let problem): return .refused("the record in Redis \(problem)")
        }
    }

    /// `stored` sealed under `key`; nil when it cannot be (larger than any record read back),
    /// which is counted as a failed write and reported as not stored.
    private func sealedOrReported(_ stored: StoredToken, key: String) -> [UInt8]? {
        do throws(TokenFetchError) {
            return try record.seal(stored, key: key)
        } catch {
            events.operation("write", "error")
            events.notStored(key, error.summary)
            return nil
        }
    }

    /// Stores `stored` without a lease (not used by providers, which store through `fetchForFleet`).
    public func save(_ key: String, _ stored: StoredToken) {
        guard let sealed = sealedOrReported(stored, key: key) else { return }
        let hash = Self.hash(key)
        inBackground { [self] connection throws(RedisFailure) in
            try connection.command(
                [Array("SET".utf8), Array(name("record:", hash).utf8), sealed] + Self.expiry(stored))
        }
    }

    // MARK: - SharedTokenStore

    /// A fetch for the fleet (see the type's comment). While another holds the lease, the broker
    /// waits for its record, and looks again every `leasePoll` twice; it stops waiting, and
    /// fetches alone, once that holder's lease has kept it waiting for its own `leaseMsec`; or,
    /// for a lease that outlives that (`leaseOutlives`), once half of what the provider's token had
    /// left is spent (`waiting.tokenLeft`). Short of the fetch's deadline (`waiting.fetchLeft`) it
    /// gives up waiting with a failure that says so, before the provider abandons the fetch.
    public func fetchForFleet(
        _ key: String, settings wanted: String, current: UInt64, forced: Bool, waiting: FleetWait = FleetWait(),
        accepts: @escaping @Sendable (StoredToken) -> Bool,
        fetch: @escaping @Sendable () async throws(TokenFetchError) -> FetchedToken
    ) async -> Result<SharedFetch, TokenFetchError> {
        let hash = Self.hash(key)
        let recordKey = Array(name("record:", hash).utf8)
        let leaseKey = Array(name("lease:", hash).utf8)
        let fenceKey = Array(name("fence:", hash).utf8)
        let started = ContinuousClock.now
        // Half of what the token has left: the other half is for its fetch alone, and retries.
        let tokenBound = waiting.tokenLeft.flatMap { $0 > .zero ? started.advanced(by: $0 / 2) : nil }
        let fetchBound = waiting.fetchLeft.map { started.advanced(by: $0 - Self.leasePoll) }
        var raced = 0
        while !Task.isCancelled {
            // 1. A newer record, stored by another broker.
            var storedRecord: StoredToken?
            // The version in the record's header, whatever the record (another key's, other
            // settings'): the lease script takes the lease only while it is still this one.
            var seenVersion: [UInt8] = []
            switch await call({ connection throws(RedisFailure) in
                try Self.readRecord(connection, recordKey)
            })
            {
            case .failure: return await alone(key, settings: wanted, current: current, fetch: fetch)
            case .success(let reply):
                let asked = WallTime()
                // A value of another type (an error reply) is no record: the lease script says so.
                guard let read = RecordRead(reply) else { break }
                if StoreRecord.version(of: read.bytes) != nil { seenVersion = Array(read.bytes[8..<16]) }
                if case .success(let stored) = opened(read, key: key, askedAt: asked), stored.settings == wanted {
                    storedRecord = stored
                    if stored.version > current, stored.isValid(at: WallTime()), accepts(stored) {
                        leaseSettled(key, hash)
                        return .success(SharedFetch(record: stored, origin: .fromFleet, fetched: nil))
                    }
                }
            }
            // 2. The lease.
            let notices = watching.withLock { $0.notices[hash] ?? 0 }
            let seen = seenVersion
            let asked = ContinuousClock.now
            let acquired = await call({ connection throws(RedisFailure) in
                try connection.command([
                    Array("EVAL".utf8), Array(Self.acquireScript.utf8), Array("3".utf8), leaseKey, fenceKey, recordKey,
                    self.owner, Array(String(self.settings.leaseMsec).utf8),
                    seen, Array(String(Self.fenceLimit).utf8),
                    Array(String(RedisStoreSettings.leaseMsecRange.upperBound).utf8),
                ])
            })
            guard case .success(let reply) = acquired else {
                return await alone(key, settings: wanted, current: current, fetch: fetch)
            }
            // When to look again, while the lease is another's or the record changes.
            var lookAgain = ContinuousClock.now.advanced(by: Self.leasePoll * 2)
            switch LeaseAnswer(reply) {
            case .acquired(let answer):
                leaseSettled(key, hash)
                // Checked here too: a version beyond what the API reads would refuse its callers.
                guard answer < Self.fenceLimit, let fence = UInt64(exactly: answer) else {
                    refused(fenceKey, fenceProblem(fenceKey))
                    return await alone(key, settings: wanted, current: current, fetch: fetch)
                }
                refused(fenceKey, nil)
                events.operation("lease", "acquired")
                return await fetchHoldingLease(
                    key, settings: wanted, fence: fence, stored: storedRecord, current: current, forced: forced,
                    keys: (recordKey, leaseKey, fenceKey), fetch: fetch)
            case .raced:
                // A record was stored between the look above and the lease: read it (not fetch
                // again). A record that changes at every look (rewritten without end) is waited
                // on as a lease is, after the first few, not read again in a busy loop.
                leaseSettled(key, hash)
                refused(fenceKey, nil)
                raced += 1
                if raced <= Self.rereadsAtOnce { continue }
            case .held(let holder, let left):
                refused(fenceKey, nil)
                events.operation("lease", "held")
                let now = ContinuousClock.now
                let since = leaseWaits.withLock { waits -> ContinuousClock.Instant in
                    if let known = waits[hash], known.isSameLease(holder, left: left, asked: asked) {
                        return known.since
                    }
                    waits[hash] = LeaseWait(holder: holder, since: now, endsBy: now.advanced(by: .milliseconds(left)))
                    return now
                }
                // Never past this broker's own leaseMsec; nor, for a lease that outlives it, past
                // half of what the token had left. The lease ends no sooner than `left` after the
                // call was asked, and a lease of this broker's length began no later than it was
                // first answered (`since`): neither the call's time nor a lease of the fleet's
                // makes one outlive the other.
                var until = since.advanced(by: .milliseconds(settings.leaseMsec))
                if asked.advanced(by: .milliseconds(left)) > until {
                    leaseOutlives(key, leaseKey)
                    if let tokenBound { until = min(until, tokenBound) }
                }
                if now >= until { return await alone(key, settings: wanted, current: current, fetch: fetch) }
                if let fetchBound, now >= fetchBound {
                    return .failure(
                        .timeout(
                            "waited \(since.duration(to: now).wholeMilliseconds) ms for the lease "
                                + "\(String(decoding: leaseKey, as: UTF8.self)), which another broker holds: its "
                                + "record had not come by the fetch's deadline (fetchTimeoutSec)"))
                }
                lookAgain = min(lookAgain, until, fetchBound ?? until)
            case .fenceOutOfRange:
                // The fence counter is out of range (set by hand, or not a number the script can
                // count on); no lease was taken. The fleet cannot coordinate on this key.
                leaseSettled(key, hash)
                refused(fenceKey, fenceProblem(fenceKey))
                return await alone(key, settings: wanted, current: current, fetch: fetch)
            case .wrongType(let kind):
                // A key of another type than a string: the fleet cannot coordinate on it either.
                leaseSettled(key, hash)
                refused(fenceKey, Self.wrongType(name(kind, hash)))
                return await alone(key, settings: wanted, current: current, fetch: fetch)
            case .other(let other):
                // An answer the script cannot give (error replies are failures, above): the fleet
                // cannot coordinate through this Redis, so this broker fetches alone.
                leaseSettled(key, hash)
                refused(fenceKey, "the lease script was answered with \(Self.describe(other))")
                return await alone(key, settings: wanted, current: current, fetch: fetch)
            }
            // 3. Another broker fetches: wait for its record, or for its lease to end.
            while ContinuousClock.now < lookAgain {
                do {
                    try await Task.sleep(for: .milliseconds(25))
                } catch {
                    break
                }
                if watching.withLock({ $0.notices[hash] ?? 0 }) != notices { break }
            }
        }
        return .failure(.timeout("waited for another broker's token until the fetch's deadline"))
    }

    public func watch(_ key: String, settings: String, _ onRecord: @escaping @Sendable (StoredToken, Bool) -> Void)
        -> UInt64
    {
        watching.withLock { watching in
            watching.nextID += 1
            watching.byHash[Self.hash(key), default: [:]][watching.nextID] = Watcher(
                key: key, settings: settings, onRecord: onRecord)
            return watching.nextID
        }
    }

    public func stopWatching(_ key: String, id: UInt64) {
        let hash = Self.hash(key)
        watching.withLock { watching in
            watching.byHash[hash]?[id] = nil
            if watching.byHash[hash]?.isEmpty == true {
                watching.byHash[hash] = nil
                watching.notices[hash] = nil
            }
        }
        // Whatever held it up is no longer this broker's concern once nothing here watches it.
        if watching.withLock({ $0.byHash[hash] == nil }) { leaseSettled(key, hash) }
    }

    // MARK: - Fetching

    /// Holding the lease: fetches, then stores and publishes the record if the fence is still this
    /// broker's. A failed fetch keeps the lease, for this broker's retries.
    ///
    /// The record's version is the fence's, unless the store's record or `current` (the highest
    /// version the provider handed out or numbers after) already is higher; the same token again (an issuer handing out its current token)
    /// keeps the stored record's version, so that the fleet's versions stay one token, one version.
    private func fetchHoldingLease(
        _ key: String, settings wanted: String, fence: UInt64, stored existing: StoredToken?, current: UInt64,
        forced: Bool, keys: (record: [UInt8], lease: [UInt8], fence: [UInt8]),
        fetch: @Sendable () async throws(TokenFetchError) -> FetchedToken
    ) async -> Result<SharedFetch, TokenFetchError> {
        let token: FetchedToken
        do {
            token = try await fetch()
        } catch {
            return .failure(error)
        }
        let version =
            if let existing, existing.accessToken == token.accessToken { existing.version } else {
                max(fence, (existing?.version ?? 0) + 1, current + 1)
            }
        let stored = Self.record(of: token, version: version, settings: wanted)
        guard let sealed = sealedOrReported(stored, key: key) else {
            // Served here all the same; the others fetch once the lease lapses.
            return .success(SharedFetch(record: stored, origin: .fetchedAlone, fetched: token))
        }
        let message = Array(Self.hash(key).utf8) + owner + Array((forced ? "F" : "R").utf8) + sealed
        let expiry = Self.expiry(stored)[1]
        let written = await call({ connection throws(RedisFailure) in
            try connection.command(
                [
                    Array("EVAL".utf8), Array(Self.writeScript.utf8), Array("3".utf8), keys.fence, keys.record,
                    keys.lease, Array(String(fence).utf8), sealed, expiry, self.channel,
                    message,
                    self.owner,
                ])
        })
        switch written {
        case .success(.integer(1)):
            refused(keys.fence, nil)
            events.operation("write", "ok")
            return .success(SharedFetch(record: stored, origin: .fetchedForFleet, fetched: token))
        case .success(.integer):
            // A newer lease was taken while this one fetched: its record will come; this token
            // is valid all the same, and serves here until then.
            events.operation("write", "fenced")
            return .success(SharedFetch(record: stored, origin: .fetchedAlone, fetched: token))
        case .success(let other):
            refused(keys.fence, "the write script was answered with \(Self.describe(other))")
            events.operation("write", "error")
            return .success(SharedFetch(record: stored, origin: .fetchedAlone, fetched: token))
        case .failure:
            events.operation("write", "unreachable")
            return .success(SharedFetch(record: stored, origin: .fetchedAlone, fetched: token))
        }
    }

    /// Redis is out of reach: the broker fetches for itself, as without a store (unless the
    /// fetch was given up meanwhile, its call to Redis taken off the queue).
    private func alone(
        _ key: String, settings wanted: String, current: UInt64,
        fetch: @Sendable () async throws(TokenFetchError) -> FetchedToken
    ) async -> Result<SharedFetch, TokenFetchError> {
        if Task.isCancelled { return .failure(.timeout("the fetch was given up at its deadline")) }
        do {
            let token = try await fetch()
            return .success(
                SharedFetch(
                    record: Self.record(of: token, version: current + 1, settings: wanted), origin: .fetchedAlone,
                    fetched: token))
        } catch {
            return .failure(error)
        }
    }

    // MARK: - Calls

    typealias Body = @Sendable (RedisConnection) throws(RedisFailure) -> RedisConnection.Reply

    /// Runs `body` on the store's queue with a connection, made if needed, answered within
    /// `timeoutMsec` of now, its wait for its turn included; a task cancelled meanwhile takes it
    /// off the queue.
    private func call(_ body: @escaping Body) async -> Result<RedisConnection.Reply, RedisFailure> {
        let deadline = ContinuousClock.now.advanced(by: .milliseconds(settings.timeoutMsec))
        let id = calls.nextID()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                calls.enqueue(id, by: deadline) { [self] turn in
                    switch turn {
                    case .run:
                        continuation.resume(returning: perform(body, by: deadline))
                    case .late:
                        let failure = RedisFailure(
                            "Redis did not answer within \(settings.timeoutMsec) ms (the call waited for its turn behind "
                                + "the store's others)", timedOut: true)
                        foundSlow(failure)
                        continuation.resume(returning: .failure(failure))
                    case .givenUp:
                        continuation.resume(returning: .failure(RedisFailure("the call was given up")))
                    }
                }
            }
        } onCancel: { [calls] in
            calls.cancel(id)
        }
    }

    /// Runs `body` once no call waits, within `timeoutMsec` of its start, then `then` with its
    /// result, on the store's queue.
    private func inBackground(
        _ body: @escaping Body,
        then: @escaping @Sendable (Result<RedisConnection.Reply, RedisFailure>) -> Void = { _ in }
    ) {
        calls.background { [self] in
            then(perform(body, by: ContinuousClock.now.advanced(by: .milliseconds(settings.timeoutMsec))))
        }
    }

    /// A call's work, on the store's queue, by `deadline`: connects when needed (at most once per
    /// `reconnectGap` while Redis is out of reach), runs `body`, and drops the connection when it
    /// fails. An error reply (`NOAUTH`, `NOPERM`, `READONLY`, …) fails too: every command the store
    /// sends is one the fleet needs, so Redis refusing it is Redis out of reach for the fleet, not
    /// an answer; except an error about one key (`isAboutOneKey`), which is the call's answer,
    /// on a connection that stays. Within `reconnectGap` of a call that found Redis slow, fails at once.
    private func perform(_ body: Body, by deadline: ContinuousClock.Instant) -> Result<
        RedisConnection.Reply, RedisFailure
    > {
        // The broker stops: what is still queued ends at once, so that `stop` waits for one call at most.
        guard !stopping.load(ordering: .relaxed) else { return .failure(RedisFailure("the store is stopping")) }
        let now = ContinuousClock.now
        let quiet = problems.withLock { problems -> String? in
            guard let until = problems.quietUntil, now < until else { return nil }
            return problems.commands ?? "Redis is slow"
        }
        if let quiet { return .failure(RedisFailure(quiet)) }
        let connection: RedisConnection
        if let open = link.withLock({ $0.connection }) {
            connection = open
        } else {
            let last = link.withLock { $0.lastAttempt }
            if let last, let problem = problems.withLock({ $0.commands }), last.duration(to: now) < Self.reconnectGap {
                return .failure(RedisFailure(problem))
            }
            link.withLock { $0.lastAttempt = now }
            do {
                connection = try RedisConnection.connect(
                    settings, password: password, deadline: deadline, resolver: resolver)
            } catch {
                failed(error)
                return .failure(error)
            }
            link.withLock { $0.connection = connection }
        }
        connection.sharedDeadline = deadline
        defer { connection.sharedDeadline = nil }
        do throws(RedisFailure) {
            let value = try body(connection)
            if case .error(let text) = value, !Self.isAboutOneKey(text) {
                throw RedisFailure("Redis refused: \(text)")
            }
            mark(\.commands, nil)
            return .success(value)
        } catch {
            link.withLock { $0.connection = nil }
            failed(error)
            return .failure(error)
        }
    }

    /// A call on the command connection failed: slow, or out of reach.
    private func failed(_ failure: RedisFailure) {
        if failure.timedOut { foundSlow(failure) } else { mark(\.commands, failure) }
    }

    /// A call ran out of time, waiting or running: Redis is out of reach, and for `reconnectGap`
    /// every call is answered at once, without touching it.
    private func foundSlow(_ failure: RedisFailure) {
        problems.withLock { $0.quietUntil = ContinuousClock.now.advanced(by: Self.reconnectGap) }
        mark(\.commands, failure)
    }

    /// Redis answers but refuses what the fleet needs for `fenceKey` (`problem`; nil: a script
    /// for that key answered as it should): reported as out of reach while any key is refused,
    /// so that the log, `/readyz` and the metrics say the broker fetches alone, and why.
    private func refused(_ fenceKey: [UInt8], _ problem: String?) {
        let key = String(decoding: fenceKey, as: UTF8.self)
        let (before, after) = problems.withLock { problems -> (String?, String?) in
            let before = problems.unreachable
            problems.refusals[key] = problem
            if problems.unreachable == nil { problems.lastReachable = .now }
            return (before, problems.unreachable)
        }
        if (before == nil) != (after == nil) { events.reachability(after) }
    }

    /// Why a fence counter out of range is refused: names the key, never a value read from Redis.
    private func fenceProblem(_ fenceKey: [UInt8]) -> String {
        "the fence counter \(String(decoding: fenceKey, as: UTF8.self)) is outside 0 to \(Self.fenceLimit - 2), "
            + "or not a whole number in digits (delete it to let the fleet take leases again)"
    }

    /// Why a key of another type than a string is refused: names it.
    private static func wrongType(_ key: String) -> String {
        "the key \(key) holds another type than a string (Redis answered WRONGTYPE; delete it to let the fleet "
            + "take leases again)"
    }

    /// Whether an error reply is about one key, not about the connection or the user: the
    /// value's type (`WRONGTYPE`), as `GETRANGE` on a list answers. Such a reply is an answer
    /// (`perform`), and the lease script says which key (`LeaseAnswer.wrongType`). The scripts
    /// raise no other error about one key: they read each key with `redis.pcall`, and check the
    /// fence counter before `INCR`.
    static func isAboutOneKey(_ error: String) -> Bool { error.hasPrefix("WRONGTYPE ") }

    /// A lease this broker did not take outlives any it takes (`leaseMsec`), and holds up the
    /// record under `key`: `/readyz` says so, and the broker logs it once, until it ends.
    private func leaseOutlives(_ key: String, _ leaseKey: [UInt8]) {
        let lease = String(decoding: leaseKey, as: UTF8.self)
        let problem =
            "the lease \(lease), which this broker did not take, outlives any it takes (leaseMsec "
            + "\(settings.leaseMsec) ms: written by hand, by something else, or by a broker with a longer leaseMsec); "
            + "the broker fetches alone, rather than wait longer or let its token expire, until the lease ends"
        let new = problems.withLock { problems -> Bool in
            defer { problems.leases[lease] = problem }
            return problems.leases[lease] == nil
        }
        if new { events.lease(key, problem) }
    }

    /// The lease of the record under `key` (by its hash) no longer holds this broker up: it took it,
    /// another record came, or Redis refuses a key of the record's.
    private func leaseSettled(_ key: String, _ hash: String) {
        leaseWaits.withLock { _ = $0.removeValue(forKey: hash) }
        let lease = name("lease:", hash)
        let ended = problems.withLock { $0.leases.removeValue(forKey: lease) != nil }
        if ended { events.lease(key, nil) }
    }

    /// Records what one connection found (nil: Redis answered it), and reports a change of the
    /// store's reachability: reachable while both connections answer.
    private func mark(_ connection: WritableKeyPath<Problems, String?>, _ failure: RedisFailure?) {
        let (before, after) = problems.withLock { problems -> (String?, String?) in
            let before = problems.unreachable
            problems[keyPath: connection] = failure?.description
            if problems.unreachable == nil { problems.lastReachable = .now }
            return (before, problems.unreachable)
        }
        if (before == nil) != (after == nil) { events.reachability(after) }
    }

    // MARK: - Subscriber

    /// Listens on the channel until `stop()`, reconnecting after a failure; after each
    /// (re)connection it reads every watched record once, for what it may have missed.
    private func subscribe() {
        defer { subscriberEnded.signal() }
        while !stopping.load(ordering: .relaxed) {
            do throws(RedisFailure) {
                let connection = try RedisConnection.connect(settings, password: password, resolver: resolver)
                try connection.send([Array("SUBSCRIBE".utf8), channel])
                var lastProbe = ContinuousClock.now
                var confirmed = false
                while !stopping.load(ordering: .relaxed) {
                    while let reply = try connection.bufferedReply() {
                        if case .error(let text) = reply { throw RedisFailure("Redis refused: \(text)") }
                        if case .array(let parts) = reply, parts.first == .string(Array("subscribe".utf8)) {
                            // Subscribed: this connection answers; what was missed is read, once
                            // for the connection (a Redis repeating its confirmation once queued
                            // reads without end, and the fetches waited behind them).
                            mark(\.subscriber, nil)
                            if !confirmed {
                                confirmed = true
                                catchUp()
                            }
                        }
                        deliver(reply)
                    }
                    // While the command connection is out of reach, a probe a second on it says
                    // when it answers again, even for a broker with no refresh due (Redis stopped
                    // and resumed, say: this connection never broke).
                    if problems.withLock({ $0.commands }) != nil, lastProbe.duration(to: .now) >= Self.reconnectGap,
                        !probing.exchange(true, ordering: .acquiringAndReleasing)
                    {
                        lastProbe = .now
                        calls.background { [self] in
                            probing.store(false, ordering: .releasing)
                            _ = perform(
                                { connection throws(RedisFailure) in try connection.command([Array("PING".utf8)]) },
                                by: ContinuousClock.now.advanced(by: .milliseconds(settings.timeoutMsec)))
                        }
                    }
                    _ = try connection.read(waitingAtMost: 200)
                }
            } catch {
                // Out of reach (or refusing): said at once, not at the next fetch; again in a second.
                if !stopping.load(ordering: .relaxed) { mark(\.subscriber, error) }
                for _ in 0..<10 where !stopping.load(ordering: .relaxed) { usleep(100_000) }
            }
        }
    }

    /// A message on the channel: the record goes to the providers watching its key. A message is
    /// the key's hash (64 hex digits), the id of the broker that stored it (32), `F` when a forced
    /// refresh fetched it or `R`, then the sealed record. This broker's own messages are skipped.
    private func deliver(_ reply: RedisConnection.Reply) {
        guard case .array(let parts) = reply, parts.count == 3, parts[0] == .string(Array("message".utf8)),
            case .string(let payload) = parts[2], payload.count > 97
        else { return }
        guard payload.count <= 97 + StoreRecord.maximumSize else { return }
        let hash = String(decoding: payload[..<64], as: UTF8.self)
        guard Array(payload[64..<96]) != owner else { return }
        let forced = payload[96] == UInt8(ascii: "F")
        events.message()
        let watchers = watching.withLock { watching -> [Watcher] in
            // Counted only for keys watched here: a hash nobody watches leaves nothing behind.
            guard let byHash = watching.byHash[hash] else { return [] }
            watching.notices[hash, default: 0] &+= 1
            return Array(byHash.values)
        }
        let sealed = Array(payload[97...])
        for watcher in watchers {
            if case .success(let stored) = record.open(sealed, key: watcher.key), stored.settings == watcher.settings {
                watcher.onRecord(stored, forced)
            }
        }
    }

    /// Reads each watched record once (after the subscriber connected: it may have missed some),
    /// in the background, one record at a time; nothing when a catch-up is already queued.
    private func catchUp() {
        guard !catchingUp.exchange(true, ordering: .acquiringAndReleasing) else { return }
        calls.background { [self] in
            catchingUp.store(false, ordering: .releasing)
            readMissed(watching.withLock { Array($0.byHash.keys) }[...])
        }
    }

    /// Reads the first of `hashes`' records for its watchers, then queues the rest, on the store's
    /// queue: a call that waits has its turn between two of these reads.
    private func readMissed(_ hashes: ArraySlice<String>) {
        guard let hash = hashes.first else { return }
        let read = perform(
            { connection throws(RedisFailure) in
                try Self.readRecord(connection, Array(self.name("record:", hash).utf8))
            },
            by: ContinuousClock.now.advanced(by: .milliseconds(settings.timeoutMsec)))
        if case .success(let reply) = read, let record = RecordRead(reply), !record.bytes.isEmpty {
            let asked = WallTime()
            for watcher in watching.withLock({ $0.byHash[hash].map { Array($0.values) } ?? [] }) {
                if case .success(let stored) = opened(record, key: watcher.key, askedAt: asked),
                    stored.settings == watcher.settings
                {
                    watcher.onRecord(stored, false)
                }
            }
        }
        let rest = hashes.dropFirst()
        if !rest.isEmpty { calls.background { [self] in readMissed(rest) } }
    }

    // MARK: - Helpers

    private func name(_ kind: String, _ hash: String) -> String { settings.keyPrefix + kind + hash }

    /// Reads the record under `key` with the time Redis's own clock gives it, in one call on one
    /// connection: `GETRANGE` up to one byte past the largest record, so that a larger value
    /// (written by hand, or by something else) is refused as such, never read whole, then
    /// `PTTL`. A missing key reads as empty, as no record can be. Answers `[value, PTTL]`, or the
    /// first reply that is not one of those (an error reply fails the call, as any other does);
    /// read with `RecordRead`.
    ///
    /// The value first. A record stored between the two is then placed by its successor's time,
    /// the longer one, which leaves it as its own dates say at worst. The other order placed a
    /// new record by its predecessor's time, nearly spent: a broker served the new token as if
    /// about to expire, and fetched again at once, a second fetch in that refresh for the fleet.
    /// A key gone between the two (-2 after a value) has expired (`RecordRead`).
    private static func readRecord(_ connection: RedisConnection, _ key: [UInt8]) throws(RedisFailure)
        -> RedisConnection.Reply
    {
        let value = try connection.command([
            Array("GETRANGE".utf8), key, Array("0".utf8), Array(String(StoreRecord.maximumSize).utf8),
        ])
        guard case .string = value else { return value }
        let left = try connection.command([Array("PTTL".utf8), key])
        guard case .integer = left else { return left }
        return .array([value, left])
    }

    /// What `readRecord` answered: the value (empty: no record) and what its key has left in
    /// milliseconds by Redis's clock; nil for a key without expiry.
    private struct RecordRead {
        let bytes: [UInt8]
        let millisecondsLeft: Int64?

        /// Nil for an answer `readRecord` does not give. `PTTL` -2 (no key) after a value: the key
        /// expired, or was removed, just after it was read, so nothing is left of it.
        init?(_ reply: RedisConnection.Reply) {
            guard case .array(let parts) = reply, parts.count == 2, case .string(let bytes) = parts[0],
                case .integer(let left) = parts[1]
            else { return nil }
            self.bytes = bytes
            switch left {
            case -1: millisecondsLeft = nil
            case ..<0: millisecondsLeft = 0
            default: millisecondsLeft = left
            }
        }
    }

    /// What the lease script answered (`acquireScript`).
    private enum LeaseAnswer {
        /// The lease is this broker's, with the next fence.
        case acquired(Int64)
        /// Another holds it: SHA-1 of its id, in hex, and what it has left in milliseconds.
        case held([UInt8], Int64)
        /// The record changed since this broker read it.
        case raced
        /// The fence counter is out of range: no lease taken.
        case fenceOutOfRange
        /// One of the keys (`record:`, `lease:`, `fence:`) holds another type than a string.
        case wrongType(String)
        /// Nothing the script answers.
        case other(RedisConnection.Reply)

        init(_ reply: RedisConnection.Reply) {
            switch reply {
            case .integer(let fence) where fence > 0: self = .acquired(fence)
            case .integer(-1): self = .raced
            case .integer(-2): self = .fenceOutOfRange
            case .integer(-3): self = .wrongType("record:")
            case .integer(-4): self = .wrongType("lease:")
            case .integer(-5): self = .wrongType("fence:")
            case .array(let parts) where parts.count == 3 && parts[0] == .integer(0):
                if case .string(let holder) = parts[1], case .integer(let left) = parts[2] {
                    self = .held(holder, left)
                } else {
                    self = .other(reply)
                }
            default: self = .other(reply)
            }
        }
    }

    /// A record read with `readRecord`, opened under `key`, its dates placed by Redis's clock: its
    /// key's `PTTL`, set from the token's lifetime when it was written, counted from `asked`, this
    /// host's wall clock when the answer came (a little after Redis counted, so that a record
    /// from a clock that agrees with this one's is left as written), so that a record written by
    /// a broker whose clock runs ahead is not served past its expiry (`StoredToken.placed`). A
    /// key without expiry places nothing.
    private func opened(_ read: RecordRead, key: String, askedAt asked: WallTime)
        -> Result<StoredToken, StoreRecordProblem>
    {
        record.open(read.bytes, key: key).map { stored in
            read.millisecondsLeft.map { stored.placed(expiringWithin: .milliseconds($0), askedAt: asked) } ?? stored
        }
    }

    private static func hash(_ key: String) -> String { (try? Fingerprint.sha256Hex(key)) ?? "" }

    /// A fetched token as a record, issued now by the wall clock.
    private static func record(of token: FetchedToken, version: UInt64, settings: String) -> StoredToken {
        let issuedAt = WallTime()
        return StoredToken(
            accessToken: token.accessToken, tokenType: token.tokenType, scope: token.scope, version: version,
            issuedAt: issuedAt, expiresAt: token.lifetime.map { issuedAt.addingTimeInterval($0.inSeconds) },
            settings: settings)
    }

    /// `PX` and the milliseconds the record's token has left, or `recordLifetimeWithoutExpiry`
    /// for a token without expiry: every record written has a lifetime in Redis.
    private static func expiry(_ stored: StoredToken) -> [[UInt8]] {
        let left: Int64
        if let expiresAt = stored.expiresAt {
            left = max(1, Int64(rounding: min(expiresAt.timeIntervalSince(WallTime()) * 1000, 1e12), .towardZero) ?? 1)
        } else {
            left = recordLifetimeWithoutExpiry.components.seconds * 1000
        }
        return [Array("PX".utf8), Array(String(left).utf8)]
    }

    private static func describe(_ reply: RedisConnection.Reply) -> String {
        switch reply {
        case .error(let text): "an error (\(text))"
        case .integer: "an integer"
        case .array: "an array"
        case .status(let text): "a status (\(text))"
        case .string: "a string"
        case .null: "nil"
        }
    }

    /// Reads a key in the scripts: its value (false: none), and whether it holds another type
    /// than a string, which `redis.pcall` catches (`redis.call` raised the `WRONGTYPE` as the
    /// script's error, which named the script, not the key); any other error is raised as it came.
    static let readFunction = """
        local function read(key)
          local value = redis.pcall('GET', key)
          if type(value) == 'table' and value.err then
            if string.sub(value.err, 1, 10) == 'WRONGTYPE ' then return false, true end
            error(value)
          end
          return value, false
        end

        """

    /// Takes the lease and returns the next fence; when another holds it, `{0, SHA-1 of its id,
    /// milliseconds it has left}` (the id in hex, however long a value written by hand). Its holder
    /// asking again (retrying after a failed fetch) keeps the lease without extending it, so a
    /// broker whose own fetches fail (a local fault) holds up the fleet for `leaseMsec` at most. A
    /// lease key with no expiry, or with more left than the longest lease any broker may take
    /// (600000 ms, whatever this one's `leaseMsec`: a fleet may be in the middle of changing it),
    /// is no lease a broker took (one written by hand, or by something else): it is taken over, or
    /// it would hold up the fleet for good. -1 when the record's version (bytes 9–16 of a record,
    /// in clear; empty for no record or a value that is not one) is no longer the one the caller
    /// read, so that a broker that looked just before another stored a new record, and asks just
    /// after that one let the lease go, reads it instead of fetching again. -2, taking no lease,
    /// when the fence counter is not a whole number in digits from 0 to `fenceLimit` - 2 (its next
    /// value would be out of range, or `INCR` would refuse it: `1e5`, `+5`, `05`, ` 5` are numbers
    /// to Lua, not to `INCR`). -3, -4, -5, taking no lease, when the record, the lease or the
    /// fence holds another type than a string.
    /// KEYS: lease, fence, record. ARGV: owner, leaseMsec, the version's 8 bytes as read (or none),
    /// `fenceLimit`, the longest lease any broker may take.
    static let acquireScript =
        readFunction + """
            local record, odd = read(KEYS[3])
            if odd then return -3 end
            local version = ''
            if record and #record >= 16 and string.sub(record, 1, 8) == 'TBSTORE1' then
              version = string.sub(record, 9, 16)
            end
            if version ~= ARGV[3] then return -1 end
            local last, oddFence = read(KEYS[2])
            if oddFence then return -5 end
            local count = 0
            if last then
              if not string.match(last, '^%d+$') or (#last > 1 and string.sub(last, 1, 1) == '0') then return -2 end
              count = tonumber(last)
            end
            if count + 1 >= tonumber(ARGV[4]) then return -2 end
            local holder, oddLease = read(KEYS[1])
            if oddLease then return -4 end
            if holder ~= ARGV[1] then
              if holder then
                local left = redis.call('PTTL', KEYS[1])
                if left >= 0 and left <= tonumber(ARGV[5]) then return {0, redis.sha1hex(holder), left} end
              end
              redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
            end
            local fence = redis.call('INCR', KEYS[2])
            redis.call('PEXPIRE', KEYS[2], 86400000)
            return fence
            """

    /// Stores and publishes a record if the fence is still the writer's, then lets its lease go; 1 when stored.
    /// KEYS: fence, record, lease. ARGV: fence, record, milliseconds it lives (`expiry`), channel, message, owner.
    /// A fence or lease of another type than a string (set since the lease was taken) is not the
    /// writer's: 0, or the lease left as it is.
    static let writeScript =
        readFunction + """
            if read(KEYS[1]) ~= ARGV[1] then return 0 end
            redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
            redis.call('PUBLISH', ARGV[4], ARGV[5])
            if read(KEYS[3]) == ARGV[6] then redis.call('DEL', KEYS[3]) end
            return 1
            """
}
