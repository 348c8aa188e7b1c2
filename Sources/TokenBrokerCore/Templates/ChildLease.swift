/// A template's child as the template hands it out: the child, what the caller keeps beside it,
/// and when it was last read. A caller that keeps the lease reads the same child again with
/// `ProviderTemplate.renew(_:)`, which takes only the lease's own lock: no look-up of the
/// child's values (hashing an SDK's scope URL costs more than the rest of the renewal), no
/// template lock shared with every other child's requests.
///
/// Rules:
/// - The template keeps each child's read time here, and nowhere else.
/// - Once the template drops the child (idle), or shuts down, the lease is ended: `renew` gives
///   nothing, and the caller asks the template again (which makes a new child, or says why not).
///   An ended lease lets go of the child and its attachment: a caller may keep a lease without
///   keeping a dropped child alive.
///   The drop checks the read time and ends the lease in one step under the lease's lock, so a
///   renewal is either seen by the drop (the child stays) or refused: no renewal succeeds for a
///   child that is being dropped.
///
/// Locking: the lease's lock is taken alone, or inside the template's (never the other way round).
///
/// Not to be confused with the token store's refresh lease (`leaseMsec`), which says which
/// broker of a fleet fetches.
public final class ChildLease<Child: Sendable, Attachment: Sendable, Instant: InstantProtocol>: Sendable {
    /// The child and what the caller keeps beside it (the token routes' rendered answers), as a
    /// read of the lease gives them.
    public struct Held: Sendable {
        public let child: Child
        public let attachment: Attachment
    }

    private let state: Lock<State>

    private struct State: Sendable {
        var last: Instant
        /// The child and attachment; nil once the lease has ended, so that a caller keeping an
        /// ended lease does not keep the dropped child, its token and its rendered answers.
        var held: Held?
    }

    /// A lease read at `readAt`. The template makes its children's; a test's stand-in template may make its own.
    public init(child: Child, attachment: Attachment, readAt: Instant) {
        state = Lock(State(last: readAt, held: Held(child: child, attachment: attachment)))
    }

    /// Counts a read at `now` and gives the child, unless the lease has ended (nil).
    func renew(at now: Instant) -> Held? {
        state.withLock { state in
            guard let held = state.held else { return nil }
            state.last = max(state.last, now)
            return held
        }
    }

    /// When the child was last read.
    var lastRead: Instant { state.withLock { $0.last } }

    /// Ends the lease when the child has been idle for `limit` at `now` (its last read at least
    /// `limit` before); whether it did.
    func endIfIdle(for limit: Instant.Duration, at now: Instant) -> Bool {
        // What the lease lets go of is released after its lock (the template, which holds the
        // same child, lets go of it after its own).
        var released: Held?
        state.withLock { state in
            guard state.held != nil, state.last.advanced(by: limit) <= now else { return }
            swap(&released, &state.held)
        }
        return released != nil
    }

    /// Ends the lease (the template shut down).
    func end() {
        var released: Held?
        state.withLock { swap(&released, &$0.held) }
    }
}
