/// The provider's rules as a pure state machine: events in, actions out, no clock and no I/O.
///
/// `TokenProvider` owns one inside a `Lock` and carries out the actions it returns: start a
/// fetch, arm the single timer, complete waiters. Every rule of the WAF SDK's token provider
/// lives here, so that tests can drive it step by step at exact instants.
///
/// | rule | where |
/// |---|---|
/// | fetch at start, refresh at the earlier of `tokenRefreshDelaySec` and 75–85 % of the lifetime | `start`, `fetchSucceeded` |
/// | backoff 100 ms doubling for `maxRetryCount` failures, then every `maxErrorTokenRefreshDelayMsec` | `fetchFailed` |
/// | no fetch before the issuer's `Retry-After` has passed, whoever asks | `fetchFailed`, `startFetchIfIdle`, `addWaiter` |
/// | pause after `tokenRefreshDelaySec` without activity; resume on the next read | `tick`, `noteActivity` |
/// | one fetch in flight, shared by every waiter | `startFetchIfIdle` |
/// | a fetch not done within `fetchTimeoutSec` fails as `timeout`; its late result is ignored | `tick`, `fetchSucceeded` |
/// | a new version only for a new token: the same access token again only updates the expiry | `fetchSucceeded` |
/// | a replacement at a reload serving the old provider's token keeps its version | `numberAfter`, `fetchSucceeded` |
/// | a forced refresh's waiters are answered by its token, even the same one again | `addWaiter`, `fetchSucceeded` |
/// | forced refresh only for the current version, 5 per 30 s (a template's, for all its children) | `forceRefresh`, `shareForcedRefreshes` |
/// | on demand: fetch per call, after `maxRetryCount` retries fall back to the previous valid token | `addWaiter`, `fetchFailed` |
/// | with a store, no fetch before its record is read; a valid record is served, and refreshed on its schedule | `storeLoaded` |
/// | a fleet's record numbered no higher than this provider's versions is refreshed past, not numbered anew | `recordArrived` |
public struct ProviderStateMachine<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    public typealias Token = CachedToken<Instant>

    /// How a waiter ends.
    public enum WaitOutcome: Sendable {
        /// A valid token newer than the waiter's `after`. `stale` is true when refresh is failing.
        case token(Token, stale: Bool)
        /// On demand, the retries ran out: the previous token, when still valid, comes back stale.
        case exhausted(previous: Token?, lastError: TokenFetchError?)
        /// The deadline passed first. `current` is the valid token still cached, if any.
        case timedOut(current: Token?, lastError: TokenFetchError?)
        /// The provider is shutting down.
        case shuttingDown
        /// The waiting task was cancelled (`TokenProvider.onTokenReady`); the machine never reports it.
        case cancelled
    }

    /// What the owner must do after an event.
    public enum Action: Sendable {
        /// Start one upstream fetch and report it back with `fetchSucceeded` or `fetchFailed`,
        /// naming it by `fetchNumber`, read when the action is carried out.
        case startFetch
        /// The fetch numbered so took longer than `fetchTimeout`: it has been counted as failed
        /// with this error; cancel it, and report the failure. Its result, if it ever comes, is ignored.
        case abandonFetch(number: UInt64, TokenFetchError)
        /// Complete these waiters, all with the same outcome, outside the lock. One action for
        /// all the waiters a new token wakes: ten thousand of them are one list, not ten thousand actions.
        case complete(waiters: [UInt64], WaitOutcome)
    }

    /// The answer to a forced refresh.
    public enum ForcedRefreshDecision: Sendable {
        /// The rejected version is not the current one: here is the current, valid token.
        case current(Token)
        /// A refresh is under way: wait for a version newer than `after`.
        case refreshing(after: UInt64?)
        /// Too many forced refreshes in the window: try again after the given time.
        case excessive(retryAfter: Duration)
    }

    private enum WaiterKind: Sendable { case ready, onDemand }
    private struct Waiter: Sendable {
        /// The version the waiter has; it wants a newer one.
        var after: UInt64?
        var kind: WaiterKind
        /// Without background refresh: the waiter wants a token fetched after it asked, so the
        /// next successful fetch answers it even when it brings back the same token.
        var wantsFetch: Bool
        /// Waits for a forced refresh: the refresh's token answers it, even the same one again.
        var forRefresh: Bool
        /// A failed fetch answers it (`.timedOut`) instead of the retries that follow.
        var endsOnFailedFetch = false
        /// It named a version this provider never handed out (`addWaiter`): its deadline
        /// answers it with the valid token held, not `.timedOut`.
        var answersAtDeadline = false
        /// When its wait ends.
        var deadline: Instant
    }

    // MARK: - Settings

    public let backgroundRefresh: Bool
    public let pauseWhenIdle: Bool
    public let retryPolicy: RetryPolicy
    public let schedule: RefreshSchedule
    /// The longest one fetch may take before it counts as failed (`fetchTimeoutSec`).
    public let fetchTimeout: Duration
    private let jitter: Jitter

    // MARK: - State

    /// The newest accepted token: the cache with background refresh, the previous token without.
    public private(set) var cached: Token?
    public private(set) var isFetching = false
    public private(set) var isPaused = false
    /// Consecutive failed fetches since the last success.
    public private(set) var failures = 0
    public private(set) var lastError: TokenFetchError?
    /// When the next fetch is due (a refresh or a retry); nil when none is planned.
    public private(set) var fetchDueAt: Instant?
    /// The number of the fetch in flight, or of the last one: results that name another are ignored.
    public private(set) var fetchNumber: UInt64 = 0
    /// When the fetch in flight is given up; nil when none is in flight.
    public private(set) var fetchDeadline: Instant?
    /// No fetch starts before this instant: the issuer's `Retry-After` after the last failure.
    /// Every path that starts a fetch honours it (the schedule, a forced refresh, an on-demand
    /// request, a read that resumes a paused provider); it ends with a success or on its own.
    public private(set) var notBefore: Instant?
    private var lastActivity: Instant
    private var lastVersion: UInt64 = 0
    private var nextWaiterID: UInt64 = 0
    private var waiters: [UInt64: Waiter] = [:]
    private var deadlines = DeadlineQueue<Instant>()
    private var forcedWindow: ForcedRefreshWindow<Instant>
    /// A template's child counts its forced refreshes in its template's window, shared with the
    /// other children, under its values, and its early refreshes in the template's window of
    /// those (`shareForcedRefreshes`); nil: in `forcedWindow` and `earlyWindow`.
    private var sharedWindow:
        (
            window: SharedForcedRefreshWindow<Instant>, early: SharedForcedRefreshWindow<Instant>,
            child: TokenRequestValues
        )?
    /// The early refreshes (`forceRefresh(rejected:now:early:)`), in a window of their own with
    /// the same limits: the retrier's callers cannot use up its places.
    private var earlyWindow: ForcedRefreshWindow<Instant>
    /// True until the stored record has been read (`storeLoaded`): no fetch starts before it.
    public private(set) var awaitingStore: Bool
    /// The provider has a store: its versions outlive the process (a file store), or are the
    /// fleet's (Redis), so a version above this provider's highest is a newer one, not an old one.
    private let hasStore: Bool
    /// A fetch was asked for while the record was being read: start it then, unless the record serves.
    private var fetchWantedAfterStore = false
    /// The fetch in flight was started by a forced refresh (the retrier), not by the schedule: a
    /// shared store tells the fleet, whose brokers count it in their windows (`forcedElsewhere`).
    public private(set) var fetchIsForced = false
    /// A forced refresh was asked for while the record was being read: it refreshes once the
    /// record is in, since the record may hold the very token the caller was refused.
    private var refreshForcedAfterStore = false
    /// The current token of the provider this one replaces (`numberAfter`): the same access
    /// token fetched here keeps the version it had there, since a version grows only with a new token.
    private var inherited: Token?
    /// The store's version of the cached token when this provider serves it under a higher
    /// number of its own (`adopt`): other brokers serve it under that version, or under numbers
    /// of theirs above it, so a refused-token retry naming any of them refreshes it
    /// (`forceRefresh`). Nil while the cached token has one version.
    private var renumberedFrom: UInt64?

    /// - Parameter awaitingStore: the provider has a store, whose record comes first (`storeLoaded`).
    /// - Parameter versionsAfter: the first token's version is the next one after it (a provider
    ///   that replaces another at a reload numbers its tokens after the one it replaces).
    public init(
        configuration: ProviderConfiguration, now: Instant, jitter: Jitter = .random, awaitingStore: Bool = false,
        versionsAfter: UInt64 = 0
    ) {
        self.awaitingStore = awaitingStore
        hasStore = awaitingStore
        lastVersion = versionsAfter
        backgroundRefresh = configuration.backgroundRefreshEnabled
        pauseWhenIdle = configuration.pauseWhenIdle
        retryPolicy = RetryPolicy(
            maxRetryCount: configuration.effectiveMaxRetryCount,
            slowDelay: .milliseconds(configuration.maxErrorTokenRefreshDelayMsec))
        schedule = RefreshSchedule(refreshDelay: .seconds(configuration.tokenRefreshDelaySec))
        forcedWindow = ForcedRefreshWindow(
            interval: .seconds(configuration.forcedRefreshWindowSec),
            maximumAttempts: configuration.forcedRefreshMaxAttempts)
        earlyWindow = forcedWindow
        fetchTimeout = configuration.effectiveFetchTimeout
        self.jitter = jitter
        lastActivity = now
    }

    // MARK: - Reading

    /// When the owner's single timer must next fire: the next fetch, the deadline of the fetch
    /// in flight, or the earliest waiter deadline.
    public var nextWakeup: Instant? {
        // Read after every request's look-up: compared in place, with no array built.
        func earlier(_ one: Instant?, _ other: Instant?) -> Instant? {
            guard let one else { return other }
            guard let other else { return one }
            return min(one, other)
        }
        return earlier(earlier(fetchDueAt, fetchDeadline), deadlines.earliest)
    }

    /// The cached token if it is still valid at `now`; never an expired one.
    public func validToken(at now: Instant) -> Token? {
        guard let cached, cached.isValid(at: now) else { return nil }
        return cached
    }

    /// Whether a valid token is being served while refresh fails.
    public func isStale(at now: Instant) -> Bool { failures > 0 && hasValidToken(at: now) }

    /// Whether a valid token is cached; reads it in place, without a copy of the token.
    public func hasValidToken(at now: Instant) -> Bool { cached?.isValid(at: now) ?? false }

    /// Waiters not yet completed.
    public var waiterCount: Int { waiters.count }

    /// Deadlines kept, finished waiters' among them (`DeadlineQueue` removes lazily).
    public var deadlinesKept: Int { deadlines.count }

    /// What the provider is doing at `now`, for readiness and metrics.
    public func phase(at now: Instant) -> ProviderPhase {
        if isFetching { return .refreshing }
        if isPaused { return .paused }
        if failures > 0 { return hasValidToken(at: now) ? .backingOff : .expired }
        return hasValidToken(at: now) ? .fresh : .expired
    }

    // MARK: - Events

    /// The provider starts: with background refresh, it fetches at once, unless a request got
    /// there first (a template's child is asked for before its task runs): a fetch in flight, a
    /// refresh planned after its token or a retry after its failure then stand.
    public mutating func start(now: Instant) -> [Action] {
        lastActivity = now
        guard backgroundRefresh, !isFetching, fetchDueAt == nil else { return [] }
        return startFetchIfIdle(now: now)
    }

    /// A request's read: with background refresh, the valid token if newer than `newerThan`,
    /// never waiting; without it, `.onDemand` with the last token while valid, and nothing changes.
    ///
    /// With background refresh it counts as activity, so it resumes a paused provider
    /// (`.unavailable(wasPaused: true)` says it did when there is no token to serve).
    public mutating func read(newerThan: UInt64 = 0, now: Instant) -> (read: TokenRead<Instant>, actions: [Action]) {
        guard backgroundRefresh else { return (.onDemand(cached: validToken(at: now)), []) }
        let wasPaused = isPaused
        let actions = noteActivity(now: now)
        guard let token = validToken(at: now), token.version > newerThan else {
            return (.unavailable(wasPaused: wasPaused, awaitingFirstToken: cached == nil && lastError == nil), actions)
        }
        return (.token(token, stale: failures > 0, secondsLeft: token.secondsLeft(at: now)), actions)
    }

    /// Registers a waiter for a valid token newer than `after` (`TokenProvider.addWaiter`).
    ///
    /// Without a store, an `after` above every version this provider handed out, or was numbered
    /// after (a provider it replaced at a reload, a template's dropped children), is not one of
    /// its versions: it names a token from before it (a broker restarted, a provider removed and
    /// added again), which the token held here replaces, since it is another token whatever its
    /// number. It waits for a token newer than the one held, as for a version of its own, and
    /// its deadline answers it with the token held (`answersAtDeadline`), never `.timedOut`,
    /// which would become a 304 naming a version the client never had while its token is from
    /// a process whose keys are gone. Not at once: a client that long-polls two brokers without
    /// a store, each with numbers of its own, would then be answered at once by each in turn, a
    /// loop with no wait; this way it gets at most one answer per wait. With a store, versions outlive the process or are the fleet's, and
    /// such a version is a newer one (another broker's, not yet read here), as it is for a
    /// forced refresh's waiter: both keep it, and wait for a version above it.
    ///
    /// - Parameters:
    ///   - onDemand: true for a request without background refresh (`TokenRead.onDemand`): the
    ///     waiter wants a token fetched for it and gives up when the retries run out.
    ///   - forRefresh: true for the waiter of a forced refresh (`forceRefresh` said `refreshing`):
    ///     the refresh's token answers it even when it is the same token again, which then keeps
    ///     its version; a refresh that already succeeded answers it at once. A failing refresh
    ///     keeps it waiting through the retries, as any waiter, unless `endsOnFailedFetch`.
    ///   - endsOnFailedFetch: the first fetch that fails answers the waiter, `.timedOut` with the
    ///     valid token still cached and the fetch's error, instead of the retries that follow (a
    ///     proxied request whose token was refused: its refused answer goes on then).
    /// - Returns: the waiter's id, and the actions, which may complete it at once.
    public mutating func addWaiter(
        after requested: UInt64?, deadline: Instant, onDemand: Bool = false, forRefresh: Bool = false,
        endsOnFailedFetch: Bool = false, now: Instant
    )
        -> (id: UInt64, actions: [Action])
    {
        var actions = noteActivity(now: now)
        nextWaiterID += 1
        let id = nextWaiterID
        let unknown = !forRefresh && !hasStore && (requested ?? 0) > lastVersion
        let requested = unknown ? lastVersion : requested
        // Without background refresh every call wants a token fetched after it asked.
        let after = backgroundRefresh ? requested : max(requested ?? 0, lastVersion)
        if let token = validToken(at: now),
            token.version > (after ?? 0) || (forRefresh && !isFetching && failures == 0 && !isHeldOff(at: now))
        {
            actions.append(.complete(waiters: [id], .token(token, stale: isStale(at: now))))
            return (id, actions)
        }
        if deadline <= now {
            actions.append(.complete(waiters: [id], deadlineOutcome(answersWithToken: unknown, now: now)))
            return (id, actions)
        }
        // A waiter that wants a fetch (on demand, or a forced refresh's) gets now what it would
        // get at its deadline when the issuer's Retry-After lets no fetch start before then: on
        // demand, the previous token as when the retries run out; a forced refresh, the current one.
        if onDemand || forRefresh, !isFetching, let notBefore, notBefore >= deadline {
            let outcome: WaitOutcome =
                onDemand
                ? .exhausted(previous: validToken(at: now), lastError: lastError)
                : .timedOut(current: validToken(at: now), lastError: lastError)
            actions.append(.complete(waiters: [id], outcome))
            return (id, actions)
        }
        waiters[id] = Waiter(
            after: requested, kind: onDemand ? .onDemand : .ready, wantsFetch: !backgroundRefresh,
            forRefresh: forRefresh, endsOnFailedFetch: endsOnFailedFetch, answersAtDeadline: unknown,
            deadline: deadline)
        deadlines.insert(id, at: deadline)
        // Ask for a token now when nothing valid can satisfy the waiter, unless a fetch or a
        // retry is already planned: a failing issuer keeps its backoff however many wait. Inside
        // the issuer's Retry-After, this plans the fetch for when it ends (`startFetchIfIdle`).
        if !isFetching, fetchDueAt == nil, !backgroundRefresh || !hasValidToken(at: now) {
            actions += startFetchIfIdle(now: now)
        }
        return (id, actions)
    }

    /// What a waiter gets at its deadline: `.timedOut` with the valid token held; for a waiter
    /// that named a version this provider never handed out, that token itself.
    private func deadlineOutcome(answersWithToken: Bool, now: Instant) -> WaitOutcome {
        if answersWithToken, let token = validToken(at: now) { return .token(token, stale: isStale(at: now)) }
        return .timedOut(current: validToken(at: now), lastError: lastError)
    }

    /// Forgets a waiter whose caller went away. The shared fetch goes on for the others.
    public mutating func removeWaiter(_ id: UInt64) {
        waiters[id] = nil
        dropDeadlinesIfIdle()
    }

    /// The retrier: the caller's token `rejected` was refused downstream. The caller of an older
    /// version gets the current token at once. The current version, or a newer one, is
    /// refreshed: in a fleet, a newer version is one another broker handed out (this one has
    /// not yet read its record), and answering with the older token held here would hand back
    /// one that was refused before it; a version from before a restart without a store costs one
    /// forced refresh, within the window like any other. So is an older version from the
    /// store's version of the cached token up, when this provider serves that token under a
    /// number of its own (`renumberedFrom`): the caller may hold the very same token, as another
    /// broker numbered it. Inside the issuer's `Retry-After` no
    /// fetch starts and no place in the window is used: the caller waits for the retry planned
    /// for when it ends (`addWaiter` answers at once when that is past the caller's deadline).
    ///
    /// - Parameter early: a refresh ahead of the schedule, not a refused token: the token is
    ///   valid, but a client treats it as expired sooner than the broker refreshes it (a cloud
    ///   SDK's margin). Counted in a window of early refreshes (`earlyWindow`, or for a child its
    ///   template's, shared as the retrier's is), with the same limits, never in the retrier's:
    ///   callers forcing refreshes, on this provider or on its template's other children, cannot
    ///   use up its places and leave the SDK a token it takes for expired, and the template as a
    ///   whole still makes at most `forcedRefreshMaxAttempts` early fetches per window, however
    ///   many children it has. Not told to the fleet as a forced refresh (`fetchIsForced`): it
    ///   does not count in the other brokers' retrier windows. The caller asks once per version.
    public mutating func forceRefresh(rejected: UInt64?, now: Instant, early: Bool = false) -> (
        ForcedRefreshDecision, [Action]
    ) {
        var actions = noteActivity(now: now)
        if let rejected, let token = validToken(at: now), rejected < token.version,
            rejected < (renumberedFrom ?? .max)
        {
            return (.current(token), actions)
        }
        if isFetching { return (.refreshing(after: cached?.version), actions) }
        if awaitingStore {
            refreshForcedAfterStore = true
            return (.refreshing(after: cached?.version), actions)
        }
        if isHeldOff(at: now) {
            actions += startFetchIfIdle(now: now)
            return (.refreshing(after: cached?.version), actions)
        }
        if let wait = early ? admitEarly(at: now) : admitForced(at: now) {
            return (.excessive(retryAfter: wait), actions)
        }
        actions += startFetchIfIdle(now: now)
        fetchIsForced = isFetching && !early
        return (.refreshing(after: cached?.version), actions)
    }

    /// The upstream fetch brought a token.
    ///
    /// A version is a new token: when the access token is the one cached (a file read again, an
    /// issuer that hands out its current token until it nears expiry), the version, `issued_at`
    /// and the rendered answers stay; only the expiry becomes the one just learned, and only
    /// waiters that the cached token would answer now (it had expired, say) are woken.
    /// - Parameters:
    ///   - fetch: the `fetchNumber` of the fetch that brought it; a result of any other fetch
    ///     (one abandoned at its deadline) is ignored. Nil: the fetch in flight, whichever it is.
    ///   - wallTime: the wall-clock time of `now`, kept for `issued_at`.
    public mutating func fetchSucceeded(_ token: FetchedToken, fetch: UInt64? = nil, now: Instant, wallTime: WallTime)
        -> [Action]
    {
        guard endFetch(fetch, succeeded: true) else { return [] }
        let expiresAt = token.lifetime.map { now.advanced(by: $0) }
        let accepted: Token
        if var same = cached, same.token.accessToken == token.accessToken {
            // Issued when first seen: the lifetime is counted from then to the new expiry.
            same.token = token
            same.token.lifetime = expiresAt.map { same.issuedAt.duration(to: $0) }
            same.expiresAt = expiresAt
            same.renewal &+= 1
            accepted = same
        } else if let inherited, inherited.token.accessToken == token.accessToken,
            inherited.version > (cached?.version ?? 0), inherited.version >= lastVersion
        {
            // The replaced provider's token, fetched again (a token file read by the provider
            // that replaced it at a reload): a client holding it has it under that version,
            // unless a higher one has been seen since (a record read afterwards), which a
            // version going back to it would contradict.
            accepted = Token(
                token: token, version: inherited.version, issuedAt: now, expiresAt: expiresAt, issuedAtDate: wallTime)
        } else {
            lastVersion += 1
            accepted = Token(
                token: token, version: lastVersion, issuedAt: now, expiresAt: expiresAt, issuedAtDate: wallTime)
        }
        if cached?.token.accessToken != accepted.token.accessToken { renumberedFrom = nil }
        cached = accepted
        if backgroundRefresh {
            fetchDueAt = now.advanced(by: schedule.refreshAfter(lifetime: token.lifetime, unit: jitter.next()))
        } else {
            fetchDueAt = nil
        }
        return wake(for: accepted, now: now, answeringFetch: true)
    }

    /// A fetch through a shared store (`SharedTokenStore`) ended with `record`: fetched here for
    /// the fleet, or by another broker while this one waited. Served as a fetched token is, but
    /// with the record's version, issue time and expiry, and refreshed on the schedule its
    /// lifetime puts from its issue time.
    public mutating func fetchSucceeded(record: StoredToken, fetch: UInt64? = nil, now: Instant, wallTime: WallTime)
        -> [Action]
    {
        guard endFetch(fetch, succeeded: true) else { return [] }
        return adopt(record, now: now, wallTime: wallTime, answeringFetch: true)
    }

    /// Another broker stored `record` (the fleet's store told): served at once when it is newer
    /// than the token held and still valid, so that every broker of a fleet serves a new token
    /// moments after one of them fetched it. A fetch in flight, which will bring it too, is left alone.
    ///
    /// A record newer than the token held but numbered no higher than a version this provider
    /// handed out or numbers after (a template's child made again, after its dropped siblings'
    /// versions; a replacement at a reload, after the provider it replaced) is not served while
    /// a valid token is held: under its own number the provider's versions would go back, and
    /// under a number of its own the same token would carry two versions in the fleet, so that a
    /// retry refusing it elsewhere would be answered with it here. The provider refreshes past
    /// it instead, at once: its fetch for the fleet stores the next token numbered after its own
    /// versions (`TokenProvider.fetchOnce`), which every broker then serves under that number.
    /// Without a valid token, the record is served all the same, under a number of its own.
    public mutating func recordArrived(_ record: StoredToken, now: Instant, wallTime: WallTime) -> [Action] {
        guard !awaitingStore, !isFetching, record.isValid(at: wallTime), record.version > (cached?.version ?? 0),
            record.accessToken != cached?.token.accessToken
        else { return [] }
        if record.version <= lastVersion, hasValidToken(at: now) {
            // A paused provider, or one that fetches only on request, fetches for nobody.
            guard backgroundRefresh, !isPaused else { return [] }
            return startFetchIfIdle(now: now)
        }
        failures = 0
        lastError = nil
        notBefore = nil
        return adopt(record, now: now, wallTime: wallTime, answeringFetch: false)
    }

    /// Another broker of the fleet fetched for a forced refresh: it counts in this broker's window
    /// of forced refreshes too, so that the window (`forcedRefreshMaxAttempts` per
    /// `forcedRefreshWindowSec`) holds for the fleet, not for each broker. A template's child
    /// counts it in its template's window.
    public mutating func forcedElsewhere(now: Instant) {
        countForced(at: now)
    }

    /// Makes this provider, a template's child for `child`'s values, count its forced refreshes
    /// in its template's `window`, which the template's other children share, instead of a
    /// window of its own: the template as a whole then makes at most `forcedRefreshMaxAttempts`
    /// forced fetches per `forcedRefreshWindowSec`, however many children it has, and a child
    /// made again for the same values finds the places the one before it took. Called before
    /// the provider serves (its own window is then empty).
    ///
    /// Its early refreshes (`forceRefresh`'s `early`) count in the template's `early` window the
    /// same way, apart from the forced ones.
    public mutating func shareForcedRefreshes(
        _ window: SharedForcedRefreshWindow<Instant>, early: SharedForcedRefreshWindow<Instant>,
        as child: TokenRequestValues
    ) {
        sharedWindow = (window, early, child)
    }

    /// Serves `record` as the cached token, refreshed from its issue time, and wakes the waiters
    /// it answers (with `answeringFetch`, those a fetch answers too).
    private mutating func adopt(_ record: StoredToken, now: Instant, wallTime: WallTime, answeringFetch: Bool)
        -> [Action]
    {
        var accepted = Self.token(from: record, now: now, wallTime: wallTime)
        // When the next refresh falls: from the record's issue time, over its lifetime; for the
        // token already held (an issuer handing out its current token again), from now, over
        // what is left of it, as `fetchSucceeded` plans a renewal.
        var refreshFrom = accepted.issuedAt
        var refreshLifetime = accepted.token.lifetime
        if var same = cached, same.token.accessToken == record.accessToken {
            same.token.lifetime = accepted.expiresAt.map { same.issuedAt.duration(to: $0) }
            same.expiresAt = accepted.expiresAt
            same.renewal &+= 1
            refreshFrom = now
            refreshLifetime = accepted.expiresAt.map { now.duration(to: $0) }
            accepted = same
        } else if accepted.version <= lastVersion {
            // Versions never go back, whatever the fleet numbered it: a fetch for the fleet asks
            // for a record above this provider's versions, and numbers its own token after them,
            // but the issuer may hand back the fleet's current token (which keeps its version),
            // the provider may have been numbered after more meanwhile, and a record arriving
            // when no valid token is held is served all the same (`recordArrived`).
            renumberedFrom = accepted.version
            accepted.version = lastVersion + 1
        } else {
            renumberedFrom = nil
        }
        lastVersion = max(lastVersion, accepted.version)
        cached = accepted
        if backgroundRefresh {
            let refresh = schedule.refreshAfter(lifetime: refreshLifetime, unit: jitter.next())
            fetchDueAt = max(now, refreshFrom.advanced(by: refresh))
        } else {
            fetchDueAt = nil
        }
        return wake(for: accepted, now: now, answeringFetch: answeringFetch)
    }

    /// A record as the token it was: its version, its expiry and issue time placed on this
    /// clock by the wall clock's distance to them. What it has left is never more than its whole
    /// lifetime, and an issue time in the future counts as now.
    ///
    /// That bounds a record read as soon as it is written (one the fleet's channel brings): from
    /// a broker whose clock runs ahead of this one's, it is served for its lifetime from now, not
    /// longer. It does not bound a record read later: dated by a clock that runs ahead, its age
    /// is hidden, and its lifetime from now can reach past its expiry by as much as that clock's
    /// lead. Only a clock other than the writer's can tell: the Redis store places each record
    /// it reads by its key's time to live, counted by Redis (`StoredToken.placed`), before it
    /// comes here. The file store has no such clock: its records are dated by the clock of the
    /// host that wrote them, normally this one.
    private static func token(from record: StoredToken, now: Instant, wallTime: WallTime) -> Token {
        let age = Duration.seconds(max(0, wallTime.timeIntervalSince(record.issuedAt)))
        let lifetime = record.expiresAt.map { Duration.seconds(max(0, $0.timeIntervalSince(record.issuedAt))) }
        let left = record.expiresAt.map { expiresAt in
            min(Duration.seconds(expiresAt.timeIntervalSince(wallTime)), lifetime ?? .zero)
        }
        return Token(
            token: FetchedToken(
                accessToken: record.accessToken, tokenType: record.tokenType, lifetime: lifetime, scope: record.scope),
            version: record.version, issuedAt: now.advanced(by: .zero - age),
            expiresAt: left.map { now.advanced(by: $0) }, issuedAtDate: record.issuedAt)
    }

    /// Completes the waiters `accepted` answers: those wanting a newer version, and, when it
    /// ends a fetch (`answeringFetch`), a forced refresh's and those that asked for a fetch.
    private mutating func wake(for accepted: Token, now: Instant, answeringFetch: Bool) -> [Action] {
        // Collected first, then removed: removing while iterating would copy the whole table.
        var woken: [UInt64] = []
        if accepted.isValid(at: now) {
            woken.reserveCapacity(waiters.count)
            for (id, waiter) in waiters
            where accepted.version > (waiter.after ?? 0)
                || (answeringFetch && (waiter.forRefresh || (waiter.wantsFetch && waiter.after == nil)))
            {
                woken.append(id)
            }
        }
        if woken.count == waiters.count {
            waiters.removeAll()
        } else {
            for id in woken { waiters[id] = nil }
        }
        dropDeadlinesIfIdle()
        return woken.isEmpty ? [] : [.complete(waiters: woken, .token(accepted, stale: false))]
    }

    /// The upstream fetch failed.
    /// - Parameter fetch: as for `fetchSucceeded`: a failure of another fetch than the one in
    ///   flight is ignored.
    public mutating func fetchFailed(_ error: TokenFetchError, fetch: UInt64? = nil, now: Instant) -> [Action] {
        guard endFetch(fetch, succeeded: false) else { return [] }
        failures += 1
        lastError = error
        if let retryAfter = error.retryAfter { notBefore = now.advanced(by: retryAfter) }
        var actions: [Action] = []
        let ended = waiters.compactMap { id, waiter in waiter.endsOnFailedFetch ? id : nil }
        if !ended.isEmpty {
            for id in ended { waiters[id] = nil }
            actions.append(.complete(waiters: ended, .timedOut(current: validToken(at: now), lastError: error)))
            dropDeadlinesIfIdle()
        }
        if !backgroundRefresh, retryPolicy.isExhausted(afterFailures: failures) {
            // On demand, the waiters stop here with the previous token, if still valid.
            let previous = validToken(at: now)
            let givenUp = waiters.compactMap { id, waiter in waiter.kind == .onDemand ? id : nil }
            for id in givenUp { waiters[id] = nil }
            if !givenUp.isEmpty {
                actions.append(.complete(waiters: givenUp, .exhausted(previous: previous, lastError: error)))
            }
            dropDeadlinesIfIdle()
            if waiters.isEmpty {
                // The next request starts afresh, but `notBefore` stays: the issuer's Retry-After
                // holds whether or not anybody is waiting.
                failures = 0
                fetchDueAt = nil
                return actions
            }
        }
        // A waiter that wants a fetch and whose wait ends before the issuer's Retry-After lets
        // the next one start gets now what it would get then, as one that arrives now would
        // (`addWaiter`): on demand, the previous token as when the retries run out; a forced
        // refresh, the current one.
        if let notBefore {
            let heldPast = waiters.filter {
                $0.value.deadline <= notBefore && ($0.value.kind == .onDemand || $0.value.forRefresh)
            }
            for (id, _) in heldPast { waiters[id] = nil }
            let onDemand = heldPast.compactMap { $0.value.kind == .onDemand ? $0.key : nil }
            let forRefresh = heldPast.compactMap { $0.value.kind == .onDemand ? nil : $0.key }
            if !onDemand.isEmpty {
                actions.append(
                    .complete(waiters: onDemand, .exhausted(previous: validToken(at: now), lastError: error)))
            }
            if !forRefresh.isEmpty {
                actions.append(
                    .complete(waiters: forRefresh, .timedOut(current: validToken(at: now), lastError: error)))
            }
            dropDeadlinesIfIdle()
        }
        fetchDueAt = now.advanced(
            by: retryPolicy.delay(afterFailures: failures, unit: jitter.next(), retryAfter: error.retryAfter))
        return actions
    }

    /// The owner's timer fired: give up a fetch past its deadline, time out waiters, then start
    /// a due fetch or pause when idle.
    public mutating func tick(now: Instant) -> [Action] {
        var actions: [Action] = []
        if isFetching, let deadline = fetchDeadline, deadline <= now {
            // No source holds the provider in `refreshing`: the fetch fails, and backoff follows.
            let error = TokenFetchError.timeout(
                "the source did not finish within \(fetchTimeout.wholeMilliseconds) ms (fetchTimeoutSec)")
            let number = fetchNumber
            actions += fetchFailed(error, now: now)
            actions.insert(.abandonFetch(number: number, error), at: 0)
        }
        for id in deadlines.popDue(at: now) {
            guard let waiter = waiters.removeValue(forKey: id) else { continue }
            actions.append(
                .complete(waiters: [id], deadlineOutcome(answersWithToken: waiter.answersAtDeadline, now: now)))
        }
        dropDeadlinesIfIdle()
        guard let due = fetchDueAt, due <= now, !isFetching else { return actions }
        fetchDueAt = nil
        if !backgroundRefresh, waiters.isEmpty {
            failures = 0
            return actions
        }
        if backgroundRefresh, pauseWhenIdle, waiters.isEmpty,
            lastActivity.duration(to: now) > schedule.refreshDelay
        {
            isPaused = true
            return actions
        }
        return actions + startFetchIfIdle(now: now)
    }

    /// The store's record has been read: `record` when one was found that may be served, nil when
    /// none was (or it was refused). A record still valid by the wall clock is served as if it
    /// had just been fetched at its own issue time: same version, same expiry, its refresh at the
    /// point its lifetime puts it (at once if that has passed), so a restart makes no fetch while
    /// the token is fresh. Otherwise the fetch that waited for the record starts; so does a
    /// forced refresh asked for meanwhile, since the record may hold the token it refused.
    /// - Parameters:
    ///   - storedVersion: the version of the record found, served or not (an expired one, one
    ///     made under other settings): later tokens are numbered after it, so that versions never
    ///     go back across a restart. Nil: `record`'s.
    ///   - wallTime: the wall-clock time of `now`, which dates the record.
    public mutating func storeLoaded(
        _ record: StoredToken?, storedVersion: UInt64? = nil, now: Instant, wallTime: WallTime
    ) -> [Action] {
        guard awaitingStore else { return [] }
        awaitingStore = false
        let wanted = fetchWantedAfterStore
        let forced = refreshForcedAfterStore
        fetchWantedAfterStore = false
        refreshForcedAfterStore = false
        if let version = storedVersion ?? record?.version { lastVersion = max(lastVersion, version) }
        var actions: [Action] = []
        if cached == nil, let record, record.isValid(at: wallTime) {
            let token = Self.token(from: record, now: now, wallTime: wallTime)
            cached = token
            renumberedFrom = nil
            lastVersion = max(lastVersion, token.version)
            if backgroundRefresh {
                let refresh = schedule.refreshAfter(lifetime: token.token.lifetime, unit: jitter.next())
                fetchDueAt = max(now, token.issuedAt.advanced(by: refresh))
            }
            // A forced refresh's waiters are answered by the refresh, not by the record.
            let woken = waiters.compactMap { id, waiter in
                backgroundRefresh && !waiter.forRefresh && token.version > (waiter.after ?? 0) ? id : nil
            }
            for id in woken { waiters[id] = nil }
            dropDeadlinesIfIdle()
            if !woken.isEmpty { actions.append(.complete(waiters: woken.sorted(), .token(token, stale: false))) }
        }
        // Without background refresh a waiter wants a fetch made for it, record or not.
        if forced || (wanted && (!hasValidToken(at: now) || (!backgroundRefresh && !waiters.isEmpty))) {
            if forced { countForced(at: now) }
            actions += startFetchIfIdle(now: now)
            fetchIsForced = forced && isFetching
        }
        return actions
    }

    /// The highest version this provider has handed out, or was told to number after.
    public var highestVersion: UInt64 { lastVersion }

    /// Numbers this provider's tokens after `version` from now on, the cached one included
    /// (a replacement, before it serves, after the provider it replaces); nothing when they
    /// already are.
    ///
    /// A version grows only with a new token: a cached token that is the same access token as
    /// `predecessors` (the record a store kept for the provider replaced, read again) keeps the
    /// version it was handed out under there, so that a long-poll or a refused-token retry
    /// holding it is not answered with it again as a newer one. Only another token is
    /// renumbered after `version`.
    public mutating func numberAfter(_ version: UInt64, keeping predecessors: Token? = nil) {
        guard lastVersion <= version else { return }
        lastVersion = version
        if let predecessors { inherited = predecessors }
        guard let held = cached else { return }
        if let predecessors, held.token.accessToken == predecessors.token.accessToken {
            cached?.version = predecessors.version
            return
        }
        lastVersion += 1
        cached?.version = lastVersion
    }

    /// A waiter as a successor takes it over (`handOver`): what it asked for, and until when.
    public struct HandedWaiter: Sendable {
        public let id: UInt64
        public let after: UInt64?
        public let deadline: Instant
        public let onDemand: Bool
        public let forRefresh: Bool
        public let endsOnFailedFetch: Bool
    }

    /// Ends the provider as `shutDown` does, but gives its waiters back, in the order they
    /// came, for a successor to take over, instead of answering them `.shuttingDown`.
    public mutating func handOver() -> [HandedWaiter] {
        let handed = deadlines.entries.compactMap { entry -> HandedWaiter? in
            guard let waiter = waiters[entry.id] else { return nil }
            return HandedWaiter(
                id: entry.id, after: waiter.after, deadline: entry.deadline, onDemand: waiter.kind == .onDemand,
                forRefresh: waiter.forRefresh, endsOnFailedFetch: waiter.endsOnFailedFetch)
        }.sorted { $0.id < $1.id }
        waiters.removeAll()
        // No waiter is left to answer: this clears the deadlines and the planned fetch.
        _ = shutDown()
        return handed
    }

    /// Completes every waiter: the provider is going away.
    public mutating func shutDown() -> [Action] {
        let actions = waiters.isEmpty ? [] : [Action.complete(waiters: waiters.keys.sorted(), .shuttingDown)]
        waiters.removeAll()
        deadlines.removeAll()
        fetchDueAt = nil
        fetchDeadline = nil
        return actions
    }

    // MARK: - Helpers

    /// Records a read. A paused provider resumes: it fetches at once if its refresh is overdue.
    private mutating func noteActivity(now: Instant) -> [Action] {
        lastActivity = now
        guard isPaused else { return [] }
        isPaused = false
        if let token = validToken(at: now) {
            let due = token.issuedAt.advanced(by: schedule.refreshAfter(lifetime: token.token.lifetime, unit: 0.5))
            if due > now {
                fetchDueAt = due
                return []
            }
        }
        return startFetchIfIdle(now: now)
    }

    /// Takes a place in the window of forced refreshes (the template's, for a child), or says
    /// how long until one is free.
    private mutating func admitForced(at now: Instant) -> Duration? {
        guard let shared = sharedWindow else { return forcedWindow.admit(at: now) }
        return shared.window.admit(at: now, by: shared.child)
    }

    /// Takes a place in the window of early refreshes (the template's, for a child), or says
    /// how long until one is free.
    private mutating func admitEarly(at now: Instant) -> Duration? {
        guard let shared = sharedWindow else { return earlyWindow.admit(at: now) }
        return shared.early.admit(at: now, by: shared.child)
    }

    /// Counts a forced fetch the window did not decide on (`ForcedRefreshWindow.count`).
    private mutating func countForced(at now: Instant) {
        guard let shared = sharedWindow else { return forcedWindow.count(at: now) }
        shared.window.count(at: now, by: shared.child)
    }

    /// Whether the issuer's Retry-After still forbids a fetch at `now`.
    private func isHeldOff(at now: Instant) -> Bool { notBefore.map { now < $0 } ?? false }

    /// Forgets every deadline once nobody waits, so that finished waiters leave no timer behind;
    /// while some wait, drops the finished waiters' deadlines once they outnumber the live ones
    /// well (amortized O(1) per waiter), so that they never pile up beyond a few times the waiters.
    private mutating func dropDeadlinesIfIdle() {
        if waiters.isEmpty {
            deadlines.removeAll()
        } else if deadlines.count > 2 * waiters.count + 64 {
            deadlines.keepOnly { waiters[$0] != nil }
        }
    }

    /// Starts the single upstream fetch unless one is already in flight, with its deadline.
    /// Inside the issuer's Retry-After it plans the fetch for when that ends instead.
    private mutating func startFetchIfIdle(now: Instant) -> [Action] {
        guard !isFetching else { return [] }
        fetchIsForced = false
        guard !awaitingStore else {
            fetchWantedAfterStore = true
            return []
        }
        if let notBefore, now < notBefore {
            // Wanted now, and held off only by the issuer: as soon as it allows, even when the
            // backoff after the failure had planned the retry later (`maxErrorTokenRefreshDelayMsec`
            // past the retries), as a forced refresh or a request outside the window would fetch.
            fetchDueAt = notBefore
            isPaused = false
            return []
        }
        isFetching = true
        isPaused = false
        fetchDueAt = nil
        fetchNumber += 1
        fetchDeadline = now.advanced(by: fetchTimeout)
        return [.startFetch]
    }

    /// Ends fetch `number` (nil: the one in flight), succeeded or not; false when it is not the
    /// one the machine waits for, whose result is then ignored.
    private mutating func endFetch(_ number: UInt64?, succeeded: Bool) -> Bool {
        guard isCurrent(number) else { return false }
        isFetching = false
        fetchDeadline = nil
        if succeeded {
            failures = 0
            lastError = nil
            notBefore = nil
        }
        return true
    }

    /// Whether a result of fetch `number` is the one the machine waits for (nil: whichever is).
    private func isCurrent(_ number: UInt64?) -> Bool {
        guard let number else { return true }
        return isFetching && number == fetchNumber
    }
}
