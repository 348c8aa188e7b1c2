/// What the broker keeps beside each child of its templates (the token routes' rendered
/// answers): an object, so that the template's request path can be specialised in this module,
/// which does not know the routes' types.
public typealias ChildAttachment = AnyObject & Sendable

/// A provider template (`perRequest`) and its children: one provider per combination of values
/// that requests (or token files) asked for, made on first use and dropped once idle.
///
/// Rules:
/// - A child is made on the first request for its values, started at once (its `run()` in a
///   task the template keeps), and found again by every later request for the same values.
/// - At most `maxChildren` children live at once; past it, `child(for:)` refuses with the time
///   after which the earliest idle child could be dropped (at least 1 s; `childIdleSec` when
///   every child is held).
/// - A child neither read (through `child(for:)` or a renewal of its lease) nor held for
///   `childIdleSec`, and without waiters (a long-poll in progress counts as reading), is
///   dropped: removed, its lease ended, then shut down, its token and timers gone.
/// - A held child (`hold(_:)`, a token file's) is never dropped for idleness until released.
/// - A child's versions go on after every version a dropped child handed out: the template keeps
///   the highest (one number, whatever the values), and makes each child after it, so that a
///   client holding a dropped child's version N is answered by the new child's token after N.
///   A template that replaces another at a reload starts after the one it replaces.
/// - The children share one window of forced refreshes (`SharedForcedRefreshWindow`): the
///   template as a whole makes at most `forcedRefreshMaxAttempts` forced fetches per
///   `forcedRefreshWindowSec`, however many children it has, and a child made again for values
///   whose child was dropped finds the places that child took. One child takes at most half the
///   places (rounded up) while the others take none, so that the rest are there for the others'
///   first forced refreshes (a token refused downstream). A cloud SDK route's refresh inside
///   its margin is not among them: the children count those in a second window of the
///   template's, shared the same way, which callers forcing refreshes cannot use up.
///
/// Locking: one lock, `state`, and each child's lease's own (taken inside `state`, or alone by
/// `renew`). While `state` is held the template reads its clock and its table, and reads,
/// renews and ends leases, nothing else: children are made, started, asked for their status
/// and shut down after it is released, and a timer task is created after it too (as
/// `TokenProvider` does).
///
/// - Important: call `run()` from a task you own: it drops idle children until `shutDown()`.
public final class ProviderTemplate<Child: TemplateChild, Attachment: Sendable, C: Clock>: Sendable,
    TemplateStatusReporting
where C.Duration == Duration {
    /// The template's settings, as configured (`perRequest`, allow-lists, bounds).
    public let configuration: ProviderConfiguration
    /// The template's name: its children's name too, in routes, logs and metrics.
    public var name: String { configuration.name }
    /// The clock of idle times.
    public let clock: C
    private let makeChild: @Sendable (TokenRequestValues, UInt64) -> Child
    private let attach: @Sendable (Child) -> Attachment
    private let events: TemplateEvents
    private let idleLimit: Duration
    /// The window of forced refreshes every child counts in, made again or not.
    private let forcedRefreshes: SharedForcedRefreshWindow<Child.ChildInstant>
    /// The window of early refreshes (a cloud SDK's margin) every child counts in, apart from
    /// the forced ones, with the same limits.
    private let earlyRefreshes: SharedForcedRefreshWindow<Child.ChildInstant>
    private let state: Lock<State>

    /// A child as handed out, with its read time: see `ChildLease`.
    public typealias Lease = ChildLease<Child, Attachment, C.Instant>

    private struct Entry: Sendable {
        let lease: Lease
        /// The child and its attachment, which the template keeps while the child lives (the
        /// lease lets go of them when it ends).
        let held: Lease.Held
        /// The child's own number, which its task reports when it ends.
        let number: UInt64
        var holds: Int = 0

        var child: Child { held.child }
    }

    private struct State: Sendable {
        var children: [TokenRequestValues: Entry] = [:]
        /// Children's `run()` tasks that have not ended, by the child's number: dropped children's too.
        var tasks: [UInt64: Task<Void, Never>] = [:]
        /// The numbers of children dropped for idleness whose `run()` has not ended yet.
        var dropping: Set<UInt64> = []
        var nextNumber: UInt64 = 0
        /// The highest version handed out by children no longer here (dropped ones, and the
        /// replaced template's at a reload): new children are numbered after it.
        var retiredVersions: UInt64 = 0
        var timer: Task<Void, Never>?
        var timerDeadline: C.Instant?
        var timerGeneration: UInt64 = 0
        var isShutDown = false
        var runEnds: AsyncStream<Never>.Continuation?
    }

    /// - Parameters:
    ///   - makeChild: the provider for one combination of values, numbering its tokens after the
    ///     version given (`TokenProvider`'s `versionsAfter`); called outside the lock, and
    ///     possibly twice for one combination when two first requests race (the spare one is
    ///     never run and fetches nothing).
    ///   - attach: what the caller keeps beside each child (the token routes' rendered answers).
    ///   - events: hooks for logs and metrics.
    ///   - versionsAfter: children number their tokens after it: a template that replaces
    ///     another at a reload starts after the versions the other's children handed out.
    public init(
        configuration: ProviderConfiguration, clock: C,
        makeChild: @escaping @Sendable (TokenRequestValues, UInt64) -> Child,
        attach: @escaping @Sendable (Child) -> Attachment,
        events: TemplateEvents = TemplateEvents(), versionsAfter: UInt64 = 0
    ) {
        self.configuration = configuration
        self.clock = clock
        self.makeChild = makeChild
        self.attach = attach
        self.events = events
        idleLimit = .seconds(configuration.childIdleSec)
        forcedRefreshes = SharedForcedRefreshWindow(for: configuration)
        earlyRefreshes = SharedForcedRefreshWindow(for: configuration)
        var state = State()
        state.retiredVersions = versionsAfter
        self.state = Lock(state)
    }

    // MARK: - Versions

    /// The highest version any of its children handed out, dropped ones included, or that it
    /// was told to number after.
    public var highestVersion: UInt64 {
        // The children are asked outside the lock, as everywhere in the template.
        let (retired, children) = state.withLock { state in
            (state.retiredVersions, state.children.values.map(\.child))
        }
        return children.reduce(retired) { highest, child in max(highest, child.highestVersion) }
    }

    /// Numbers its children's tokens after `version` from now on (a replacement at a reload,
    /// before it serves, after the template it replaces): the children made from now on, and
    /// those already made, such as a token file's, made while the old template still served,
    /// whose children could hand out more versions meanwhile.
    public func numberAfter(_ version: UInt64) {
        let children = state.withLock { state in
            state.retiredVersions = max(state.retiredVersions, version)
            return state.children.values.map(\.child)
        }
        // Outside the lock, as everywhere in the template.
        for child in children { child.renumber(after: version) }
    }

    // MARK: - Children

    /// The lease of the child for `values`, made and started on first use (the means to read the
    /// child again without this look-up, `renew(_:)`), and the child with its attachment.
    ///
    /// Counts as a read: the child's idle time starts again. Refused past `maxChildren`
    /// (`.full`), and once the template has shut down (`.stopped`).
    // The token routes call this for every request to a child, through an existential: the
    // attribute makes that call run code specialised for the broker's own template (children on
    // the continuous clock, attachments as objects), not generic code that looks up type
    // metadata and copies entries through value witnesses at run time.
    @_specialize(where Child == TokenProvider<ContinuousClock>, Attachment == ChildAttachment, C == ContinuousClock)
    public func child(for values: TokenRequestValues) -> Result<(lease: Lease, held: Lease.Held), ChildRefusal> {
        switch find(values, holding: false) {
        case .found(let entry): .success((entry.lease, entry.held))
        case .refused(let refusal): refused(refusal, values)
        case .absent(let versionsAfter):
            adopt(values, holding: false, versionsAfter: versionsAfter).map { ($0.lease, $0.held) }
        }
    }

    /// Reads the child of `lease` (one of this template's) again, as `child(for:)` would: its idle
    /// time starts again. Nil once the child was dropped or the template shut down: then ask
    /// `child(for:)`, which makes a new child or says why not.
    @_specialize(where Child == TokenProvider<ContinuousClock>, Attachment == ChildAttachment, C == ContinuousClock)
    public func renew(_ lease: Lease) -> Lease.Held? { lease.renew(at: clock.now) }

    /// A child kept alive while held (a token file's): never dropped for idleness until
    /// `release(_:)`. It counts toward `maxChildren`; each hold needs its own release.
    public func hold(_ values: TokenRequestValues) -> Result<Child, ChildRefusal> {
        switch find(values, holding: true) {
        case .found(let entry): .success(entry.child)
        case .refused(let refusal): refused(refusal, values)
        case .absent(let versionsAfter): adopt(values, holding: true, versionsAfter: versionsAfter).map(\.child)
        }
    }

    /// Ends one hold of `hold(_:)`; the child's idle time starts now.
    public func release(_ values: TokenRequestValues) {
        let now = clock.now
        var timer: (C.Instant, UInt64)?
        state.withLock { state in
            guard let index = state.children.index(forKey: values), state.children.values[index].holds > 0 else {
                return
            }
            state.children.values[index].holds -= 1
            _ = state.children.values[index].lease.renew(at: now)
            timer = planTimer(&state)
        }
        if let timer { armTimer(until: timer.0, generation: timer.1) }
    }

    /// What one look-up under the lock found.
    private enum Lookup {
        /// The child, now read (or held once more).
        case found(Entry)
        /// No child, and no room for one (or the template stopped): nothing is made.
        case refused(ChildRefusal)
        /// No child, and room for one: to be made outside the lock, numbered after this version.
        case absent(versionsAfter: UInt64)
    }

    /// The child for `values` under the lock, counted as read (or held once more), or why none can be made.
    private func find(_ values: TokenRequestValues, holding: Bool) -> Lookup {
        let now = clock.now
        return state.withLock { state -> Lookup in
            guard !state.isShutDown else { return .refused(.stopped) }
            if let found = read(values, holding: holding, now: now, &state) { return .found(found) }
            if let full = noRoom(state, now: now) { return .refused(full) }
            // A child dropped for these values was removed under this lock, its versions counted.
            return .absent(versionsAfter: state.retiredVersions)
        }
    }

    /// The child for `values`, counted as read now (or held once more); nil when there is none. Under the lock.
    private func read(_ values: TokenRequestValues, holding: Bool, now: C.Instant, _ state: inout State) -> Entry? {
        guard let index = state.children.index(forKey: values) else { return nil }
        // A child in the table has a lease not ended: the template ends it only as it removes the child.
        _ = state.children.values[index].lease.renew(at: now)
        if holding { state.children.values[index].holds += 1 }
        return state.children.values[index]
    }

    /// `.full` when the template has `maxChildren` children; nil while there is room. Under the lock.
    private func noRoom(_ state: State, now: C.Instant) -> ChildRefusal? {
        guard state.children.count >= configuration.maxChildren else { return nil }
        return .full(limit: configuration.maxChildren, retryAfter: retryAfter(state, now: now))
    }

    /// Reports a refusal past `maxChildren`, and returns it.
    private func refused<Success>(_ refusal: ChildRefusal, _ values: TokenRequestValues) -> Result<
        Success, ChildRefusal
    > {
        if case .full = refusal { events.refused(name, values) }
        return .failure(refusal)
    }

    /// Makes the child for `values` (outside the lock), then adds it unless another request added
    /// one meanwhile (which is then the child), and starts it.
    private func adopt(_ values: TokenRequestValues, holding: Bool, versionsAfter: UInt64) -> Result<
        Entry, ChildRefusal
    > {
        let child = makeChild(values, versionsAfter)
        child.shareForcedRefreshes(forcedRefreshes, early: earlyRefreshes, as: values)
        let attachment = attach(child)
        let now = clock.now
        var timer: (C.Instant, UInt64)?
        let outcome = state.withLock { state -> Result<(entry: Entry, isNew: Bool), ChildRefusal> in
            guard !state.isShutDown else { return .failure(.stopped) }
            if let found = read(values, holding: holding, now: now, &state) { return .success((found, false)) }
            if let full = noRoom(state, now: now) { return .failure(full) }
            state.nextNumber += 1
            let entry = Entry(
                lease: Lease(child: child, attachment: attachment, readAt: now),
                held: Lease.Held(child: child, attachment: attachment), number: state.nextNumber,
                holds: holding ? 1 : 0)
            state.children[values] = entry
            timer = planTimer(&state)
            return .success((entry, true))
        }
        switch outcome {
        case .failure(let refusal):
            return refused(refusal, values)
        case .success(let (entry, isNew)):
            if isNew {
                events.made(name, values)
                launch(entry, values)
            }
            if let timer { armTimer(until: timer.0, generation: timer.1) }
            return .success(entry)
        }
    }

    /// When the earliest child that could be dropped will be: at least 1 s from now, and
    /// `childIdleSec` when every child is held.
    private func retryAfter(_ state: State, now: C.Instant) -> Duration {
        let earliest = state.children.values.lazy.filter { $0.holds == 0 }.map(\.lease.lastRead).min()
        guard let earliest else { return idleLimit }
        return max(.seconds(1), now.duration(to: earliest.advanced(by: idleLimit)))
    }

    /// Starts the child's `run()` in a task, which waits at a gate until its handle is stored:
    /// stored, under the lock, only while the template runs, so that `run()` awaits every child
    /// task that ever ran; turned away otherwise (the template shut down, and shut the child
    /// down with it, between the unlock and the store).
    ///
    /// A child dropped for idleness is reported once more when its `run()` has ended
    /// (`TemplateEvents.ended`): a fetch that finished as it was dropped has saved its token by
    /// then. Unless a child for the same values has been made since, which is not reported.
    private func launch(_ entry: Entry, _ values: TokenRequestValues) {
        let (gate, opener) = AsyncStream<Bool>.makeStream()
        let child = entry.child
        let number = entry.number
        let task = Task { [self] in
            var admission = gate.makeAsyncIterator()
            guard await admission.next() == true else { return }
            await child.run()
            // Not when a child for the same values was made meanwhile (it may rely on the record),
            // nor once the template has shut down (its children's records stay, as at a stop).
            let ended = state.withLock { state in
                state.tasks.removeValue(forKey: number)
                return state.dropping.remove(number) != nil && state.children[values] == nil && !state.isShutDown
            }
            if ended { events.ended(name, values) }
        }
        let stored = state.withLock { state -> Bool in
            guard !state.isShutDown else { return false }
            state.tasks[number] = task
            return true
        }
        opener.yield(stored)
        opener.finish()
        if !stored { task.cancel() }
    }

    // MARK: - Idle children

    /// Drops idle children until `shutDown()` is called or the calling task is cancelled, then
    /// shuts down, and returns once every child's task has ended.
    public func run() async {
        let (stream, continuation) = AsyncStream<Never>.makeStream()
        let alreadyShutDown = state.withLock { state -> Bool in
            state.runEnds = continuation
            return state.isShutDown
        }
        if alreadyShutDown { continuation.finish() }
        sweep()
        await withTaskCancellationHandler {
            for await _ in stream {}
        } onCancel: {
            continuation.finish()
        }
        shutDown()
        while let task = state.withLock({ $0.tasks.first?.value }) {
            await task.value
        }
    }

    /// Shuts every child down, stops the timer and ends `run()`; later requests are refused (`.stopped`).
    public func shutDown() {
        // The children and their attachments are let go of after the lock, with `children`.
        let (children, timer, runEnds) = state.withLock { state in
            state.isShutDown = true
            let children = state.children.values.map { entry in
                entry.lease.end()
                return entry.held
            }
            state.children.removeAll()
            let timer = state.timer
            state.timer = nil
            state.timerDeadline = nil
            return (children, timer, state.runEnds)
        }
        timer?.cancel()
        for held in children { held.child.shutDown() }
        runEnds?.finish()
    }

    /// Drops the children idle for `childIdleSec` at the clock's now, and plans the next sweep.
    ///
    /// Two steps: the children due are picked under the lock; their waiters are read outside it
    /// (a child with waiters is being read, and its idle time starts again); the rest are removed
    /// under the lock, each only if no request read it in between (its lease ended in the same
    /// step under the lease's lock, so that no renewal slips between the check and the end),
    /// then shut down outside it.
    func sweep() {
        let now = clock.now
        let due = state.withLock { state -> [(TokenRequestValues, Child)] in
            guard !state.isShutDown else { return [] }
            return state.children.compactMap { values, entry in
                entry.holds == 0 && entry.lease.lastRead.advanced(by: idleLimit) <= now ? (values, entry.child) : nil
            }
        }
        let waiting = Set(due.compactMap { values, child in child.status().waiters > 0 ? values : nil })
        // Read before the child is removed, so that a child made for the same values just after
        // its removal is numbered after it. A version it makes after this read is one nobody read:
        // a read starts its idle time again, and it is then not dropped.
        let versions = due.map { _, child in child.highestVersion }
        var timer: (C.Instant, UInt64)?
        // The children dropped, and their attachments, are let go of after the lock, with `dropped`.
        let dropped = state.withLock { state -> [(TokenRequestValues, Lease.Held)] in
            guard !state.isShutDown else { return [] }
            var dropped: [(TokenRequestValues, Lease.Held)] = []
            for ((values, child), version) in zip(due, versions) {
                guard let index = state.children.index(forKey: values),
                    state.children.values[index].child === child
                else { continue }
                let entry = state.children.values[index]
                guard entry.holds == 0 else { continue }
                if waiting.contains(values) {
                    _ = entry.lease.renew(at: now)
                } else if entry.lease.endIfIdle(for: idleLimit, at: now) {
                    state.retiredVersions = max(state.retiredVersions, version)
                    state.children.remove(at: index)
                    dropped.append((values, entry.held))
                    state.dropping.insert(entry.number)
                }
            }
            timer = planTimer(&state)
            return dropped
        }
        for (values, held) in dropped {
            held.child.shutDown()
            events.dropped(name, values)
        }
        if let timer { armTimer(until: timer.0, generation: timer.1) }
    }

    /// Decides, under the lock, when the next sweep is due: when the earliest child not held
    /// could be idle for `childIdleSec`. Returns the timer to arm once the lock is released, if
    /// the deadline changed; replacing a timer cancels the old one when the new one is stored.
    private func planTimer(_ state: inout State) -> (C.Instant, UInt64)? {
        guard !state.isShutDown else { return nil }
        let wanted = state.children.values.lazy.filter { $0.holds == 0 }.map(\.lease.lastRead).min()?.advanced(
            by: idleLimit)
        // A timer earlier than needed only sweeps and plans again; a later one would miss a child.
        if let current = state.timerDeadline, let wanted, current <= wanted { return nil }
        guard let wanted else { return nil }
        state.timerGeneration += 1
        state.timerDeadline = wanted
        return (wanted, state.timerGeneration)
    }

    /// Starts the sweep timer of `generation`, stored only if still current (see `TokenProvider.armTimer`).
    private func armTimer(until deadline: C.Instant, generation: UInt64) {
        let timer = Task { [self, clock] in
            do {
                try await clock.sleep(until: deadline, tolerance: nil)
            } catch {
                return
            }
            timerFired(generation)
        }
        let replaced = state.withLock { state -> (stored: Bool, old: Task<Void, Never>?) in
            guard !state.isShutDown, state.timerGeneration == generation else { return (false, nil) }
            defer { state.timer = timer }
            return (true, state.timer)
        }
        replaced.old?.cancel()
        if !replaced.stored { timer.cancel() }
    }

    private func timerFired(_ generation: UInt64) {
        let current = state.withLock { state -> Bool in
            guard !state.isShutDown, state.timerGeneration == generation else { return false }
            state.timer = nil
            state.timerDeadline = nil
            return true
        }
        if current { sweep() }
    }

    // MARK: - Status

    /// The children's count, how many are ready, their waiters, and the held children's statuses.
    public func status() -> TemplateStatus {
        let children = state.withLock { state in state.children.values.map { ($0.child, $0.holds > 0) } }
        var status = TemplateStatus(name: name, maxChildren: configuration.maxChildren)
        status.children = children.count
        for (child, held) in children {
            let childStatus = child.status()
            if childStatus.isReady { status.ready += 1 }
            status.waiters += childStatus.waiters
            if held { status.held.append(childStatus) }
        }
        return status
    }
}

/// What a template needs of a child: `TokenProvider` conforms.
public protocol TemplateChild: AnyObject, Sendable {
    /// The instants of the child's clock, in which it counts its forced refreshes.
    associatedtype ChildInstant: InstantProtocol where ChildInstant.Duration == Duration

    /// What the child is doing now (its waiters keep it from being dropped).
    func status() -> ProviderStatus
    /// The highest version it handed out: a child made after it was dropped goes on after it.
    var highestVersion: UInt64 { get }
    /// Numbers its tokens after `version` from now on, its current one included (`numberAfter`).
    func renumber(after version: UInt64)
    /// Runs the child until `shutDown()`.
    func run() async
    /// Stops the child: its waiters are answered, its timers and fetch stop, its `run()` returns.
    func shutDown()
    /// Counts its forced refreshes in `window`, its template's, and its early ones in `early`,
    /// under its `values`, from now on; called once, before it is started or handed out.
    func shareForcedRefreshes(
        _ window: SharedForcedRefreshWindow<ChildInstant>, early: SharedForcedRefreshWindow<ChildInstant>,
        as values: TokenRequestValues)
}

extension TokenProvider: TemplateChild {
    public func renumber(after version: UInt64) { numberAfter(version, keeping: nil) }
}

/// Why a template gave no child.
public enum ChildRefusal: Error, Sendable, Equatable {
    /// `maxChildren` children live already; one could be dropped in `retryAfter`.
    case full(limit: Int, retryAfter: Duration)
    /// The template has shut down.
    case stopped
}

/// A template's state, for `/readyz` and the metrics.
public struct TemplateStatus: Sendable {
    /// The template's name.
    public var name: String
    /// `maxChildren`.
    public var maxChildren: Int
    /// Children alive now.
    public var children = 0
    /// Children that can answer now (`ProviderStatus.isReady`).
    public var ready = 0
    /// Requests waiting on any child.
    public var waiters = 0
    /// The statuses of the children held by token files, which readiness counts.
    public var held: [ProviderStatus] = []

    public init(name: String, maxChildren: Int) {
        self.name = name
        self.maxChildren = maxChildren
    }

    /// Whether every held child is ready: children made by requests do not make the broker unready.
    public var heldReady: Bool { held.allSatisfy(\.isReady) }
}

/// Anything that reports a template's status: what the admin listener and the metrics read.
public protocol TemplateStatusReporting: AnyObject, Sendable {
    /// The template's name.
    var name: String { get }
    /// The template's state now.
    func status() -> TemplateStatus
}

/// Hooks through which a template reports its children, for logs and metrics. Each gets the
/// template's name and the child's values.
public struct TemplateEvents: Sendable {
    /// A child was made (on its first request or hold).
    public var made: @Sendable (String, TokenRequestValues) -> Void
    /// A child was dropped, idle for `childIdleSec`.
    public var dropped: @Sendable (String, TokenRequestValues) -> Void
    /// A dropped child's `run()` ended, its last fetch with it, and no child for its values lives:
    /// nothing more of it is stored.
    public var ended: @Sendable (String, TokenRequestValues) -> Void
    /// A new child was refused: `maxChildren` live already.
    public var refused: @Sendable (String, TokenRequestValues) -> Void

    /// Hooks that do nothing unless given.
    public init(
        made: @escaping @Sendable (String, TokenRequestValues) -> Void = { _, _ in },
        dropped: @escaping @Sendable (String, TokenRequestValues) -> Void = { _, _ in },
        ended: @escaping @Sendable (String, TokenRequestValues) -> Void = { _, _ in },
        refused: @escaping @Sendable (String, TokenRequestValues) -> Void = { _, _ in }
    ) {
        self.made = made
        self.dropped = dropped
        self.ended = ended
        self.refused = refused
    }
}
