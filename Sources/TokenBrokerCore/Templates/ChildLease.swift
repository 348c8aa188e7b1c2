/// A template's child as the template hands it out: the child, what the caller keeps beside it,
/// and when it was last read. A caller that keeps the lease reads the same child again with
/// `ProviderTemplate.renew(_:)`, which takes only the lease's own lock: no look-up of the
/// child's values (hashing an SDK's scope URL costs more than the rest of the renewal), no
/// template lock shared with every other child's requests.
///
/// Rules:
/// - The template keeps each child's read time here, and nowhere else.
/// - Once the template drops the child (idle), or shuts down, the lease is ended: `renew` says
///   false, and the caller asks the template again (which makes a new child, or says why not).
///   The drop checks the read time and ends the lease in one step under the lease's lock, so a
///   renewal is either seen by the drop (the child stays) or refused: no renewal succeeds for a
///   child that is being dropped.
///
/// Locking: the lease's lock is taken alone, or inside the template's (never the other way round).
///
/// Not to be confused with the token store's refresh lease (`leaseMsec`), which says which
/// broker of a fleet fetches.
public final class ChildLease<Child: Sendable, Attachment: Sendable, Instant: InstantProtocol>: Sendable {
    /// The child.
    public let child: Child
    /// What the caller keeps beside the child (the token routes' rendered answers).
    public let attachment: Attachment
    private let reads: Lock<Reads>

    private struct Reads: Sendable {
        var last: Instant
        var ended = false
    }

    /// A lease read at `readAt`. The template makes its children's; a test's stand-in template may make its own.
    public init(child: Child, attachment: Attachment, readAt: Instant) {
        self.child = child
        self.attachment = attachment
        reads = Lock(Reads(last: readAt))
    }

    /// Counts a read at `now`, unless the lease has ended; whether it had not.
    func renew(at now: Instant) -> Bool {
        reads.withLock { reads in
            guard !reads.ended else { return false }
            reads.last = max(reads.last, now)
            return true
        }
    }

    /// When the child was last read.
    var lastRead: Instant { reads.withLock { $0.last } }

    /// Ends the lease when the child has been idle for `limit` at `now` (its last read at least
    /// `limit` before); whether it did.
    func endIfIdle(for limit: Instant.Duration, at now: Instant) -> Bool {
        reads.withLock { reads in
            guard !reads.ended, reads.last.advanced(by: limit) <= now else { return false }
            reads.ended = true
            return true
        }
    }

    /// Ends the lease (the template shut down).
    func end() { reads.withLock { $0.ended = true } }
}
