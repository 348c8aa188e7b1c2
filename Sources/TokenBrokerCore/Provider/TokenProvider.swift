import Synchronization

/// One configured provider: keeps a token from its source fresh, as the WAF SDK's provider does.
///
/// The rules live in `ProviderStateMachine`; this class carries out its actions. It runs one
/// upstream fetch at a time in a task of its own, keeps one timer for every deadline (the next
/// refresh or retry, the fetch in flight, and the earliest waiter), and completes waiters
/// outside its lock. A fetch past its deadline is cancelled and reported as a `timeout`; the
/// provider does not wait for it to end.
///
/// Locking: one lock, `state`, guards the machine and the handles of the provider's tasks. While
/// it is held the provider calls only the machine and its two clocks: waiters' completions,
/// events, and the creation and cancellation of tasks come after it is released (`Work`, `perform`).
/// The only other locks, `onTokenReady`'s one per call, are never held together with `state`.
///
/// - Important: call `run()` from a task you own; the provider fetches nothing until then.
///   `shutDown()` (or cancelling that task) completes every waiter with `.shuttingDown` and
///   ends `run()` once any fetch in flight has ended.
public final class TokenProvider<C: Clock>: Sendable where C.Duration == Duration {
    /// The rules, on the provider's clock.
    public typealias Machine = ProviderStateMachine<C.Instant>
    /// A token as the provider hands it out.
    public typealias Token = CachedToken<C.Instant>
    /// How a waiter ends.
    public typealias WaitOutcome = Machine.WaitOutcome
    /// Called once when a waiter ends, on whichever thread ended it.
    public typealias Completion = @Sendable (WaitOutcome) -> Void

    /// The provider's settings, as configured.
    public let configuration: ProviderConfiguration
    /// The configured name, in routes, logs and metrics.
    public var name: String { configuration.name }
    /// The clock of its deadlines and token lifetimes.
    public let clock: C
    private let source: any TokenSource
    /// What its tokens must be, from its source or from a store (`TokenRules`).
    private let rules: TokenRules
    private let events: ProviderEvents
    /// Where the token is kept across restarts, read once at start and written after each fetch.
    private let store: StoreSlot?
    /// `store`'s store when brokers share it: fetches then go through it, and its records arrive.
    private let shared: (any SharedTokenStore)?
    private let wallClock: @Sendable () -> WallTime
    private let state: Lock<State>

    private struct State: Sendable {
        var machine: Machine
        var completions: [UInt64: Completion] = [:]
        var timer: Task<Void, Never>?
        var timerDeadline: C.Instant?
        var timerGeneration: UInt64 = 0
        var fetch: Task<Void, Never>?
        var fetchStartedAt: C.Instant?
        var isShutDown = false
        /// The version of the last record from the fleet refused by `rules`, reported once.
        var refusedFromFleet: UInt64?
        /// Ends `run()`'s wait: finished by `shutDown()` or by cancelling `run()`'s task.
        var runEnds: AsyncStream<Never>.Continuation?
        /// After `shutDown(handingWaitersTo:)`: where each handed waiter went, by its id here,
        /// so that a caller that goes away still removes it (`removeWaiter`). Held while a handed
        /// waiter may still be removed through this provider, and let go once none is (`forwarded`
        /// and `handing` empty): a chain of reloads stays whole for the waiters handed along it
        /// (a weak link broke at the second reload, once the middle provider was freed), and a
        /// provider kept alive does not keep every later one alive.
        var successor: TokenProvider?
        var forwarded: [UInt64: UInt64] = [:]
        /// Waiters being handed over, and those of them removed meanwhile.
        var handing: Set<UInt64> = []
        /// By id: whether it was cancelled (its completion is then owed `.cancelled`).
        var removedWhileHanding: [UInt64: Bool] = [:]
        /// Waiters being handed over that the successor answered at once.
        var endedWhileHanding: Set<UInt64> = []

        /// Drops `successor` once no handed waiter can be removed through this provider any more.
        mutating func letGoOfSuccessorWhenDone() {
            if forwarded.isEmpty, handing.isEmpty { successor = nil }
        }
    }

    /// What the lock hands back to be done outside it.
    private struct Work {
        /// Waiters to complete, in groups that share one outcome (a new token wakes thousands at
        /// once). Each group's completions are stored last first, so that taking them off the
        /// end calls them in the order the action listed the waiters.
        var completions: [(waiters: [Completion], outcome: WaitOutcome)] = []
        var cancelledTimer: Task<Void, Never>?
        /// A fetch given up at its deadline: cancel it, and report the failure.
        var abandoned: (fetch: Task<Void, Never>?, error: TokenFetchError, elapsed: Duration)?
        /// The fetch the machine started, by number, to launch once the lock is released.
        var fetchToStart: UInt64?
        /// The timer to arm, for this instant and generation, once the lock is released.
        var timerToArm: (deadline: C.Instant, generation: UInt64)?
    }

    /// - Parameters:
    ///   - jitter: spreads retries and refreshes; tests pin it.
    ///   - events: hooks for logs and metrics.
    ///   - store: where the token outlives the process; nil keeps it in memory only.
    ///   - versionsAfter: the first token's version is the next one after it: a provider that
    ///     replaces another at a reload numbers its tokens after the one it replaces, so that a
    ///     client waiting for a version newer than the one it has is still answered.
    public init(
        configuration: ProviderConfiguration, source: any TokenSource, clock: C,
        jitter: Jitter = .random, events: ProviderEvents = ProviderEvents(),
        wallClock: @escaping @Sendable () -> WallTime = { WallTime() }, store: StoreSlot? = nil,
        versionsAfter: UInt64 = 0
    ) {
        self.wallClock = wallClock
        self.configuration = configuration
        rules = TokenRules(for: configuration)
        self.source = rules.applied(to: source)
        self.clock = clock
        self.events = events
        self.store = store
        shared = store?.store as? any SharedTokenStore
        state = Lock(
            State(
                machine: Machine(
                    configuration: configuration, now: clock.now, jitter: jitter, awaitingStore: store != nil,
                    versionsAfter: versionsAfter)))
    }

    // MARK: - Service

    /// Starts fetching (with a store, after its record is read, and only if the record cannot
    /// serve), then waits until `shutDown()` is called or the calling task is cancelled, then
    /// shuts down and returns once any fetch in flight has ended.
    public func run() async {
        apply(ifShutDown: ()) { machine, now in ((), machine.start(now: now)) }
        if let store { await loadStoredToken(store) }
        let watching = store.flatMap { slot in
            shared.map { shared in
                (
                    shared, slot.key,
                    shared.watch(slot.key, settings: slot.settings) { [weak self] record, forced in
                        self?.recordArrived(record, forced: forced)
                    }
                )
            }
        }
        defer { if let (shared, key, id) = watching { shared.stopWatching(key, id: id) } }
        let (stream, continuation) = AsyncStream<Never>.makeStream()
        let alreadyShutDown = state.withLock { state -> Bool in
            state.runEnds = continuation
            return state.isShutDown
        }
        if alreadyShutDown { continuation.finish() }
        await withTaskCancellationHandler {
            for await _ in stream {}
        } onCancel: {
            continuation.finish()
        }
        shutDown()
        // A fetch still running ends before this task does, so that whoever awaits the task
        // knows no fetch is left (one running at exit would use OpenSSL after it is torn down).
        // Then the provider lets go of it, since the task holds the provider.
        await state.withLock { $0.fetch }?.value
        state.withLock { $0.fetch = nil }
    }

    /// Completes every waiter with `.shuttingDown`, stops the timer and any fetch, and ends `run()`.
    public func shutDown() { end(handingWaitersTo: nil) }

    /// Shuts down as `shutDown` does, but hands the waiters to `successor` (the provider that
    /// replaces this one at a reload), each with what it asked for and its deadline, rather than
    /// answering them `.shuttingDown`. The successor is first numbered after every version this
    /// one handed out, so a waiter for a version newer than the one it has is answered by the
    /// successor's token, or by its deadline. A waiter's caller that goes away later removes it
    /// through this provider, by the id it was given here (`removeWaiter`).
    public func shutDown(handingWaitersTo successor: TokenProvider<C>) { end(handingWaitersTo: successor) }

    private func end(handingWaitersTo successor: TokenProvider<C>?) {
        var work = Work()
        var handed: [(waiter: Machine.HandedWaiter, completion: Completion)] = []
        var numberedUpTo: UInt64 = 0
        var current: Token?
        let (fetch, runEnds) = state.withLock { state -> (Task<Void, Never>?, AsyncStream<Never>.Continuation?) in
            state.isShutDown = true
            if let successor {
                numberedUpTo = state.machine.highestVersion
                current = state.machine.cached
                for waiter in state.machine.handOver() {
                    if let completion = state.completions.removeValue(forKey: waiter.id) {
                        handed.append((waiter, completion))
                    }
                }
                state.successor = successor
                state.handing = Set(handed.map(\.waiter.id))
            } else {
                collect(state.machine.shutDown(), into: &work, state: &state)
            }
            work.cancelledTimer = state.timer
            state.timer = nil
            state.timerDeadline = nil
            return (state.fetch, state.runEnds)
        }
        fetch?.cancel()
        perform(&work)
        runEnds?.finish()
        guard let successor else { return }
        // A token this provider fetched since its successor was numbered must not share a version.
        successor.numberAfter(numberedUpTo, keeping: current)
        for (waiter, completion) in handed {
            // Its answer, wherever it comes from, also ends its forwarding here: a waiter the
            // successor answers is never removed (its connection no longer waits), and its entry
            // would otherwise keep the successor, and every provider after it, alive.
            let handedID = waiter.id
            let id = successor.addWaiter(
                after: waiter.after, deadline: waiter.deadline, onDemand: waiter.onDemand,
                forRefresh: waiter.forRefresh, endsOnFailedFetch: waiter.endsOnFailedFetch
            ) { [weak self] outcome in
                self?.handedWaiterEnded(handedID)
                completion(outcome)
            }
            let removed = state.withLock { state -> Bool? in
                state.handing.remove(waiter.id)
                if let cancelled = state.removedWhileHanding.removeValue(forKey: waiter.id) {
                    state.letGoOfSuccessorWhenDone()
                    return cancelled
                }
                if state.endedWhileHanding.remove(waiter.id) != nil {
                    state.letGoOfSuccessorWhenDone()
                    return nil
                }
                state.forwarded[waiter.id] = id
                return nil
            }
            if let cancelled = removed { successor.detachWaiter(id, cancelled: cancelled) }
        }
        state.withLock { $0.letGoOfSuccessorWhenDone() }
    }

    /// A waiter handed to the successor was answered there: it is forwarded no more.
    private func handedWaiterEnded(_ id: UInt64) {
        state.withLock { state in
            if state.handing.contains(id) {
                state.endedWhileHanding.insert(id)
            } else if state.forwarded.removeValue(forKey: id) != nil {
                state.letGoOfSuccessorWhenDone()
            }
        }
    }

    /// The highest version handed out, or numbered after (`numberAfter`).
    public var highestVersion: UInt64 { state.withLock { $0.machine.highestVersion } }

    /// Numbers the tokens after `version` from now on, the cached one included, unless it is
    /// `current`'s access token, which keeps `current`'s version: for a provider that replaces
    /// another at a reload, before it serves (`ProviderStateMachine.numberAfter`).
    public func numberAfter(_ version: UInt64, keeping current: Token? = nil) {
        state.withLock { $0.machine.numberAfter(version, keeping: current) }
    }

    /// `numberAfter` the versions `predecessor` handed out, keeping its current token's version
    /// for the same token. The two locks are taken one after the other, never together.
    public func numberAfter(_ predecessor: TokenProvider<C>) {
        let (version, current) = predecessor.state.withLock { ($0.machine.highestVersion, $0.machine.cached) }
        numberAfter(version, keeping: current)
    }

    // MARK: - Reading

    /// A request's read, under one lock: with background refresh, the valid token if newer than
    /// `newerThan`, or why there is none; without it, `.onDemand` with the last token while valid. With background refresh the
    /// read counts as activity, so it resumes a provider paused while idle.
    ///
    /// Once shut down, the provider still hands out its valid token to a request that reached it
    /// before it was replaced at a reload, or before the listeners stopped taking requests, and
    /// starts nothing; without a valid token, such a request waits for none (`.onDemand(nil)`
    /// makes its wait end at once as `.shuttingDown`).
    public func read(newerThan: UInt64 = 0) -> TokenRead<C.Instant> {
        var work = Work()
        let read = state.withLock { state -> TokenRead<C.Instant> in
            let now = clock.now
            guard state.isShutDown else {
                let (read, actions) = state.machine.read(newerThan: newerThan, now: now)
                collect(actions, into: &work, state: &state)
                return read
            }
            var machine = state.machine  // a copy: what a read changes, and the actions it asks for, are dropped
            if case .token(let token, let stale, let secondsLeft) = machine.read(newerThan: newerThan, now: now).0 {
                return .token(token, stale: stale, secondsLeft: secondsLeft)
            }
            return configuration.backgroundRefreshEnabled
                ? .unavailable(wasPaused: false, awaitingFirstToken: false) : .onDemand(cached: nil)
        }
        perform(&work)
        return read
    }

    /// `addWaiter` for a task: waits for a valid token newer than `after`, at most `timeout`.
    /// Cancelling the task ends the wait at once with `.cancelled`; the shared fetch goes on.
    /// - Parameters:
    ///   - onDemand: as for `addWaiter`: after `read` said `.onDemand`.
    ///   - forRefresh: the wait of a forced refresh, which its token ends even when it is the
    ///     same token again (see `ProviderStateMachine.addWaiter`).
    ///   - endsOnFailedFetch: a failed fetch ends the wait (`.timedOut`) rather than the retries
    ///     (see `ProviderStateMachine.addWaiter`).
    public func onTokenReady(
        after: UInt64? = nil, timeout: Duration, onDemand: Bool = false, forRefresh: Bool = false,
        endsOnFailedFetch: Bool = false
    ) async -> WaitOutcome {
        // The waiter's id once registered, or `.max` when cancellation came first: whichever of
        // registration and cancellation runs second ends the waiter.
        let waiterID = Lock<UInt64?>(nil)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WaitOutcome, Never>) in
                let id = addWaiter(
                    after: after, deadline: deadline(in: timeout), onDemand: onDemand, forRefresh: forRefresh,
                    endsOnFailedFetch: endsOnFailedFetch
                ) { outcome in
                    continuation.resume(returning: outcome)
                }
                let cancelledAlready = waiterID.withLock { stored -> Bool in
                    defer { stored = id }
                    return stored == .max
                }
                if cancelledAlready { cancelWaiter(id) }
            }
        } onCancel: {
            let id = waiterID.withLock { stored -> UInt64? in
                defer { if stored == nil { stored = .max } }
                return stored
            }
            if let id { cancelWaiter(id) }
        }
    }

    /// Registers a waiter that ends through `completion` (the callback form, for suspended
    /// HTTP connections). Returns an id for `removeWaiter`.
    /// - Parameters:
    ///   - after: the version the caller has; a valid token newer than it ends the wait.
    ///   - onDemand: true after `read` said `.onDemand`: the waiter wants a token fetched for it,
    ///     and gets the previous valid token (`.exhausted`) when the retries run out.
    ///   - forRefresh: the wait of a forced refresh (see `ProviderStateMachine.addWaiter`).
    ///   - endsOnFailedFetch: a failed fetch ends the wait (see `ProviderStateMachine.addWaiter`).
    @discardableResult
    public func addWaiter(
        after: UInt64?, deadline: C.Instant, onDemand: Bool = false, forRefresh: Bool = false,
        endsOnFailedFetch: Bool, completion: @escaping Completion
    )
        -> UInt64
    {
        var work = Work()
        let id = state.withLock { state -> UInt64 in
            guard !state.isShutDown else {
                work.completions.append(([completion], .shuttingDown))
                return 0
            }
            let (id, actions) = state.machine.addWaiter(
                after: after, deadline: deadline, onDemand: onDemand, forRefresh: forRefresh,
                endsOnFailedFetch: endsOnFailedFetch, now: clock.now)
            state.completions[id] = completion
            collect(actions, into: &work, state: &state)
            return id
        }
        perform(&work)
        return id
    }

    /// `addWaiter` for a waiter that a failed fetch does not end (`TokenProviding`'s form).
    @discardableResult
    public func addWaiter(
        after: UInt64?, deadline: C.Instant, onDemand: Bool = false, forRefresh: Bool = false,
        completion: @escaping Completion
    ) -> UInt64 {
        addWaiter(
            after: after, deadline: deadline, onDemand: onDemand, forRefresh: forRefresh, endsOnFailedFetch: false,
            completion: completion)
    }

    /// Forgets a waiter whose caller went away; its completion is never called.
    public func removeWaiter(_ id: UInt64) {
        detachWaiter(id, cancelled: false)
    }

    /// The retrier: `rejected` is the version a downstream service refused.
    public func forceRefresh(rejected: UInt64?) -> Machine.ForcedRefreshDecision {
        forceRefreshStartingFetch(rejected: rejected).decision
    }

    /// A refresh ahead of the schedule of the valid token `version`, which a client treats as
    /// expired sooner than this provider refreshes it (`ProviderStateMachine.forceRefresh`'s
    /// `early`): in a window of its own, which the retrier's callers do not use up.
    public func refreshEarly(replacing version: UInt64) -> Machine.ForcedRefreshDecision {
        let decision = apply(ifShutDown: Machine.ForcedRefreshDecision.refreshing(after: nil)) { machine, now in
            machine.forceRefresh(rejected: version, now: now, early: true)
        }
        if case .excessive = decision { events.excessiveRefresh(name) }
        return decision
    }

    /// `forceRefresh`, also saying whether this call started an upstream fetch (rather than
    /// joining one under way, or finding a newer token).
    public func forceRefreshStartingFetch(rejected: UInt64?) -> (
        decision: Machine.ForcedRefreshDecision, startedFetch: Bool
    ) {
        let (decision, started) = apply(ifShutDown: (Machine.ForcedRefreshDecision.refreshing(after: nil), false)) {
            machine, now in
            let (answer, actions) = machine.forceRefresh(rejected: rejected, now: now)
            let started = actions.contains { if case .startFetch = $0 { true } else { false } }
            return ((answer, started), actions)
        }
        if case .excessive = decision { events.excessiveRefresh(name) }
        return (decision, started)
    }

    /// Makes this provider, a template's child for `values`, count its forced refreshes in its
    /// template's `window`, and its early ones in its template's `early` window
    /// (`ProviderStateMachine.shareForcedRefreshes`); called before it serves.
    public func shareForcedRefreshes(
        _ window: SharedForcedRefreshWindow<C.Instant>, early: SharedForcedRefreshWindow<C.Instant>,
        as values: TokenRequestValues
    ) {
        state.withLock { $0.machine.shareForcedRefreshes(window, early: early, as: values) }
    }

    /// What the provider is doing now, for readiness, metrics and error descriptions.
    public func status() -> ProviderStatus {
        let now = clock.now
        return state.withLock { state in
            let machine = state.machine
            let token = machine.validToken(at: now)
            return ProviderStatus(
                name: name,
                phase: machine.phase(at: now),
                version: token?.version,
                stale: machine.isStale(at: now),
                expiresIn: token?.expiresAt.map { now.duration(to: $0) },
                lastError: machine.lastError,
                consecutiveFailures: machine.failures,
                waiters: machine.waiterCount,
                backgroundRefresh: machine.backgroundRefresh,
                everHeldToken: machine.cached != nil,
                heldOffFor: machine.notBefore.flatMap { now < $0 ? now.duration(to: $0) : nil })
        }
    }

    /// The instant `duration` from now on the provider's clock.
    public func deadline(in duration: Duration) -> C.Instant { clock.now.advanced(by: duration) }

    // MARK: - Store

    /// Reads the stored record and hands it to the machine, which serves it if still valid.
    private func loadStoredToken(_ store: StoreSlot) async {
        var load = await store.store.load(store.key)
        var storedVersion: UInt64?
        if case .found(let record) = load {
            if record.settings != store.settings {
                storedVersion = record.version
                load = .refused(
                    "was made under other settings of the provider (its source or key changed, or a build that digests them otherwise wrote it)"
                )
            } else if let problem = rules.problem(with: record) {
                storedVersion = record.version
                load = .refused("holds a token this provider refuses: \(problem)")
            }
        }
        let record: StoredToken? = if case .found(let record) = load { record } else { nil }
        apply(ifShutDown: false) { machine, now in
            let actions = machine.storeLoaded(record, storedVersion: storedVersion, now: now, wallTime: wallClock())
            return (record != nil && machine.cached?.version == record?.version, actions)
        } report: { [self] served in
            events.storeLoaded(name, load, served)
        }
    }

    /// Another broker of the fleet stored `record`: served if newer (`Machine.recordArrived`);
    /// fetched for a forced refresh, it counts in this broker's window too.
    private func recordArrived(_ record: StoredToken, forced: Bool) {
        guard acceptsFromFleet(record) else { return }
        apply(ifShutDown: false) { machine, now in
            // Counted once per new token: a record replayed on the channel is not newer.
            if forced, record.version > (machine.cached?.version ?? 0) { machine.forcedElsewhere(now: now) }
            let before = machine.cached?.version
            let actions = machine.recordArrived(record, now: now, wallTime: wallClock())
            return (machine.cached?.version != before, actions)
        } report: { [self] adopted in
            if adopted { events.fromFleet(name, record) }
        }
    }

    /// Whether a record another broker stored holds a token this provider would have accepted
    /// from its source (`TokenRules.problem(with:)`); a refused one is reported once per version,
    /// however often the store offers it.
    private func acceptsFromFleet(_ record: StoredToken) -> Bool {
        guard let problem = rules.problem(with: record) else { return true }
        let first = state.withLock { state in
            defer { state.refusedFromFleet = record.version }
            return state.refusedFromFleet != record.version
        }
        if first { events.refusedFromFleet(name, record, problem) }
        return false
    }

    // MARK: - Carrying out actions

    /// Ends one waiter as cancelled, leaving the shared fetch running for the others.
    private func cancelWaiter(_ id: UInt64) {
        detachWaiter(id, cancelled: true)
    }

    /// Forgets a waiter, and when `cancelled` completes it with `.cancelled`; a waiter handed to
    /// a successor is forgotten there (`shutDown(handingWaitersTo:)`), or once it has arrived.
    private func detachWaiter(_ id: UInt64, cancelled: Bool) {
        let (completion, forward) = state.withLock { state -> (Completion?, (TokenProvider, UInt64)?) in
            if state.handing.contains(id) {
                state.removedWhileHanding[id] = cancelled
                return (nil, nil)
            }
            if let successor = state.successor, let handedID = state.forwarded.removeValue(forKey: id) {
                state.letGoOfSuccessorWhenDone()
                return (nil, (successor, handedID))
            }
            state.machine.removeWaiter(id)
            return (state.completions.removeValue(forKey: id), nil)
        }
        if let (successor, handedID) = forward { successor.detachWaiter(handedID, cancelled: cancelled) }
        if cancelled { completion?(.cancelled) }
    }

    /// Runs `event` on the machine under the lock, then carries out its actions; `ifShutDown`,
    /// leaving the machine alone, once the provider has shut down.
    /// - Parameter report: runs after the lock and before any waiter is completed, so that what
    ///   it records (a fetch's metrics and log line) is there before any answer that follows from it.
    @discardableResult
    private func apply<Result>(
        ifShutDown: Result, _ event: (inout Machine, C.Instant) -> (Result, [Machine.Action]),
        report: ((Result) -> Void)? = nil
    ) -> Result {
        var work = Work()
        let result = state.withLock { state -> Result in
            guard !state.isShutDown else { return ifShutDown }
            let (result, actions) = event(&state.machine, clock.now)
            collect(actions, into: &work, state: &state)
            return result
        }
        report?(result)
        perform(&work)
        return result
    }

    /// Turns actions into work, deciding the fetch to start and the timer to arm; called inside
    /// the lock. The tasks themselves are created by `perform`, after it.
    private func collect(_ actions: [Machine.Action], into work: inout Work, state: inout State) {
        for action in actions {
            switch action {
            case .startFetch:
                state.fetchStartedAt = clock.now
                work.fetchToStart = state.machine.fetchNumber
            case .abandonFetch(_, let error):
                let elapsed = state.fetchStartedAt.map { $0.duration(to: clock.now) } ?? .zero
                work.abandoned = (state.fetch, error, elapsed)
                state.fetch = nil
            case .complete(let ids, let outcome):
                var waiters: [Completion] = []
                waiters.reserveCapacity(ids.count)
                for id in ids.reversed() {
                    if let completion = state.completions.removeValue(forKey: id) { waiters.append(completion) }
                }
                work.completions.append((waiters, outcome))
            }
        }
        guard !state.isShutDown else { return }
        let wanted = state.machine.nextWakeup
        guard wanted != state.timerDeadline else { return }
        work.cancelledTimer = state.timer
        state.timer = nil
        state.timerDeadline = wanted
        state.timerGeneration += 1
        if let wanted { work.timerToArm = (wanted, state.timerGeneration) }
    }

    /// Cancels the replaced timer, starts the fetch and the timer `collect` decided on, then
    /// calls the completions, letting go of each once called rather than when all are done: what
    /// one holds (a suspended connection's responder, say) is then freed by the thread that
    /// finishes that connection, not at the end of a batch.
    private func perform(_ work: inout Work) {
        work.cancelledTimer?.cancel()
        if let abandoned = work.abandoned {
            abandoned.fetch?.cancel()
            events.fetched(name, .failure(abandoned.error), abandoned.elapsed)
        }
        if let timer = work.timerToArm { armTimer(until: timer.deadline, generation: timer.generation) }
        if let number = work.fetchToStart { launchFetch(number) }
        for index in work.completions.indices {
            let outcome = work.completions[index].outcome
            while let completion = work.completions[index].waiters.popLast() { completion(outcome) }
        }
    }

    /// Starts the timer of `generation`, which `collect` decided on under the lock.
    ///
    /// Started after the lock, it is stored under the lock only if its generation is still the
    /// current one, and cancelled at once otherwise. So however the store interleaves with a
    /// newer `collect` (on another thread) or a shutdown, the stored timer is the newest one: a
    /// newer `collect` cancels the handle stored before it, a timer stored after its generation
    /// was replaced is refused, and `shutDown` sets `isShutDown` before it takes the handle. A
    /// refused timer that fires all the same does nothing: `timerFired` ignores a generation that
    /// is not current.
    private func armTimer(until deadline: C.Instant, generation: UInt64) {
        let timer = Task { [self, clock] in
            do {
                try await clock.sleep(until: deadline, tolerance: nil)
            } catch {
                return
            }
            timerFired(generation)
        }
        let stored = state.withLock { state -> Bool in
            guard !state.isShutDown, state.timerGeneration == generation else { return false }
            state.timer = timer
            return true
        }
        if !stored { timer.cancel() }
    }

    /// Starts fetch `number`, which the machine started under the lock.
    ///
    /// Started after the lock, the task waits at a gate until its handle is stored, and the
    /// handle is stored, under the lock, only while the provider runs and fetch `number` is still
    /// the one in flight; otherwise the gate turns it away before it fetches anything. A shutdown
    /// or a fetch deadline between the unlock and the store thus finds no handle to cancel, but
    /// makes the store refuse; and no newer fetch can start until this one is no longer in
    /// flight, which also makes the store refuse. Once stored, the handle is where `shutDown`, an
    /// abandon at the deadline and `run()` find it, as if it had been created under the lock: no
    /// fetch reaches the source that the provider could not cancel, or `run()` not await.
    private func launchFetch(_ number: UInt64) {
        let (gate, opener) = AsyncStream<Bool>.makeStream()
        let fetch = Task { [self] in
            var admission = gate.makeAsyncIterator()
            guard await admission.next() == true else { return }
            await fetchOnce(number)
        }
        let stored = state.withLock { state -> Bool in
            guard !state.isShutDown, state.machine.isFetching, state.machine.fetchNumber == number else { return false }
            state.fetch = fetch
            return true
        }
        opener.yield(stored)
        opener.finish()
        if !stored { fetch.cancel() }
    }

    private func timerFired(_ generation: UInt64) {
        var work = Work()
        state.withLock { state in
            guard !state.isShutDown, generation == state.timerGeneration else { return }
            state.timer = nil
            state.timerDeadline = nil
            collect(state.machine.tick(now: clock.now), into: &work, state: &state)
        }
        perform(&work)
    }

    /// How one fetch ended: a token from the source, or a record through a shared store.
    private enum FetchResult {
        case token(FetchedToken)
        case shared(SharedFetch)
        case failure(TokenFetchError)
    }

    /// Runs fetch `number` and reports its result, unless the fetch was given up meanwhile.
    ///
    /// With a shared store the fetch goes through it (`SharedTokenStore.fetchForFleet`): a record
    /// another broker stored, or one fetched here for the fleet (or alone, when the store is out
    /// of reach), which the store has kept already. Otherwise the source fetches, and a store
    /// keeps the new token.
    ///
    /// The store is told the highest version this provider handed out or numbers after, not only
    /// the cached token's: a template's child made again numbers after its dropped siblings, and
    /// a replacement at a reload after the provider it replaced, so that a record at or below
    /// that (the fleet's, for these values) could only be served here under a number of its own,
    /// while the other brokers serve the same token under the record's. Asked so, the store
    /// answers with a record above it, or fetches and stores the token numbered after it, which
    /// the fleet then serves under that one number.
    private func fetchOnce(_ number: UInt64) async {
        let result: FetchResult
        if let store, let shared {
            let (current, forced) = state.withLock {
                (max($0.machine.cached?.version ?? 0, $0.machine.highestVersion), $0.machine.fetchIsForced)
            }
            let source = source
            let waiting = state.withLock { Self.fleetWait($0.machine, now: clock.now) }
            switch await shared.fetchForFleet(
                store.key, settings: store.settings, current: current, forced: forced, waiting: waiting,
                accepts: { [weak self] record in self?.acceptsFromFleet(record) ?? false },
                fetch: {
                    () async throws(TokenFetchError) -> FetchedToken in try await source.fetch()
                })
            {
            case .success(let fetched): result = .shared(fetched)
            case .failure(let error): result = .failure(error)
            }
        } else {
            do {
                result = .token(try await source.fetch())
            } catch {
                result = .failure(error)
            }
        }
        if Task.isCancelled { return }
        let started = state.withLock { $0.fetchStartedAt } ?? clock.now
        let elapsed = started.duration(to: clock.now)
        apply(ifShutDown: (false, Token?.none)) { machine, now in
            // A late result of a fetch abandoned at its deadline is not reported twice.
            let accepted = machine.isFetching && machine.fetchNumber == number
            let actions =
                switch result {
                case .token(let token): machine.fetchSucceeded(token, fetch: number, now: now, wallTime: wallClock())
                case .shared(let shared):
                    machine.fetchSucceeded(record: shared.record, fetch: number, now: now, wallTime: wallClock())
                case .failure(let error): machine.fetchFailed(error, fetch: number, now: now)
                }
            if case .failure = result { return ((accepted, nil), actions) }
            return ((accepted, machine.cached), actions)
        } report: { [self] accepted, cached in
            guard accepted else { return }
            switch result {
            case .token(let token):
                events.fetched(name, .success((token, cached?.version ?? 0)), elapsed)
                if let store, let cached { store.store.save(store.key, StoredToken(cached, settings: store.settings)) }
            case .shared(let shared):
                if let fetched = shared.fetched {
                    events.fetched(name, .success((fetched, cached?.version ?? 0)), elapsed)
                    events.fetchedFor(name, shared.origin)
                } else {
                    events.fromFleet(name, shared.record)
                }
            case .failure(let error):
                events.fetched(name, .failure(error), elapsed)
            }
        }
    }
}

extension TokenProvider {
    /// What bounds a fetch's wait for another broker's record, at `now`: what the valid token
    /// held has left, and what the fetch has left before its deadline (`FleetWait`).
    static func fleetWait(_ machine: Machine, now: C.Instant) -> FleetWait {
        FleetWait(
            tokenLeft: machine.validToken(at: now)?.expiresAt.map { now.duration(to: $0) },
            fetchLeft: machine.fetchDeadline.map { now.duration(to: $0) })
    }
}

extension TokenProvider where C == ContinuousClock {
    /// A provider on the real monotonic clock.
    public convenience init(
        configuration: ProviderConfiguration, source: any TokenSource, events: ProviderEvents = ProviderEvents()
    ) {
        self.init(configuration: configuration, source: source, clock: ContinuousClock(), events: events)
    }
}
