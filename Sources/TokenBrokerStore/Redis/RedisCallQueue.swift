import Dispatch
import Synchronization
import TokenBrokerCore

/// The store's calls to Redis, each waiting for its turn on the one command connection, and each
/// answered within `timeoutMsec` of being asked, the wait for its turn included.
///
/// One connection answers one call at a time. A Redis that answers each call within `timeoutMsec`
/// but slower than the broker's providers ask (300 ms a reply, twenty providers refreshing at
/// once) once had their calls wait without bound behind one another: each fetch gave up at the
/// provider's fetch deadline with its calls still queued, which then ran for nobody, and no token
/// came while the store counted as reachable. So:
/// - a call's deadline counts from when it was asked; when it passes before the call's turn
///   comes, the call is answered `late`, at its deadline (a timer's, whatever the call under way
///   does), without touching Redis;
/// - a caller that gives up (its task is cancelled) takes its call off the queue, answered
///   `givenUp` at once;
/// - background work (reading the records the subscriber may have missed, a probe, a `save`)
///   has its turn once no call waits, one piece at a time, and counts its time from its start.
///
/// - Important: each handler is called exactly once: with `.run` on the queue, the one thread the
///   connection is used from; with `.late` or `.givenUp` from any thread.
final class RedisCallQueue: Sendable {
    /// How a call's turn came.
    enum Turn: Sendable, Equatable {
        /// Now, on the queue, before its deadline.
        case run
        /// Never: its deadline passed while it waited.
        case late
        /// Never: its caller gave up while it waited.
        case givenUp
    }

    typealias Handler = @Sendable (Turn) -> Void
    typealias Work = @Sendable () -> Void

    private struct Waiting {
        let id: UInt64
        let deadline: ContinuousClock.Instant
        let handler: Handler
    }

    private struct State {
        /// Calls waiting for their turn, first asked first.
        var waiting: [Waiting] = []
        /// Background work, from `backgroundStart` on.
        var background: [Work] = []
        var backgroundStart = 0

        mutating func next() -> Next? {
            if !waiting.isEmpty { return .call(waiting.removeFirst()) }
            guard backgroundStart < background.count else { return nil }
            let work = background[backgroundStart]
            backgroundStart += 1
            if backgroundStart == background.count {
                background.removeAll(keepingCapacity: background.count < 1024)
                backgroundStart = 0
            } else if backgroundStart >= 1024, backgroundStart * 2 >= background.count {
                background.removeFirst(backgroundStart)
                backgroundStart = 0
            }
            return .work(work)
        }
    }

    private enum Next {
        case call(Waiting)
        case work(Work)
    }

    private let queue: DispatchQueue
    /// Where the deadlines of waiting calls fire.
    private let timers: DispatchQueue
    private let state = Lock(State())
    private let lastID = Atomic<UInt64>(0)

    init(label: String) {
        queue = DispatchQueue(label: label)
        timers = DispatchQueue(label: label + ".deadlines")
    }

    /// A new call's id, taken before `enqueue`, so that a cancellation handler can name it.
    func nextID() -> UInt64 { lastID.add(1, ordering: .relaxed).newValue }

    /// Queues call `id`, to run by `deadline`: `handler` learns how its turn came.
    /// - Important: call it from the caller's task: a task already cancelled is answered
    ///   `givenUp` at once (its cancellation handler may have run before the call was queued).
    func enqueue(_ id: UInt64, by deadline: ContinuousClock.Instant, _ handler: @escaping Handler) {
        let queued = state.withLock { state -> Bool in
            // Under the lock: a cancellation after this finds the call queued.
            guard !Task.isCancelled else { return false }
            state.waiting.append(Waiting(id: id, deadline: deadline, handler: handler))
            return true
        }
        guard queued else { return handler(.givenUp) }
        // A millisecond after the deadline, so that the call is surely late then.
        let left = max(0, ContinuousClock.now.duration(to: deadline).wholeMilliseconds + 1)
        // Held strongly: the queue outlives its last deadline (at most `timeoutMsec`). A weak
        // reference would give it a side table, which the address sanitizer's leak check reports
        // when the store is still there at exit (the object keeps the table's address shifted).
        timers.asyncAfter(deadline: .now() + .milliseconds(Int(clamping: left))) { self.end(id, .late) }
        queue.async { self.runNext() }
    }

    /// The caller of call `id` gave up: taken off the queue if it still waits.
    func cancel(_ id: UInt64) { end(id, .givenUp) }

    /// Queues `work`, to run once no call waits.
    func background(_ work: @escaping Work) {
        state.withLock { $0.background.append(work) }
        queue.async { self.runNext() }
    }

    /// Runs `work` on the queue, once everything queued before it has had its turn.
    func sync(_ work: () -> Void) { queue.sync(execute: work) }

    /// Answers call `id` with `turn` if it still waits.
    private func end(_ id: UInt64, _ turn: Turn) {
        let handler = state.withLock { state -> Handler? in
            guard let index = state.waiting.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiting.remove(at: index).handler
        }
        handler?(turn)
    }

    /// One turn, on the queue: the first waiting call, else the next background work. Each call
    /// and each work queues one turn, so none is left without.
    private func runNext() {
        switch state.withLock({ $0.next() }) {
        case .call(let call): call.handler(ContinuousClock.now < call.deadline ? .run : .late)
        case .work(let work): work()
        case nil: break
        }
    }
}
