import Glibc
import Synchronization

/// A connection's request deadline, kept in libmicrohttpd's socket context.
///
/// The request path touches it twice per request, each time with one atomic store: cleared
/// when the request has arrived whole, set again when the answer is done. Every field is
/// immutable or atomic, so it is shared between libmicrohttpd's threads and the watcher's.
final class ConnectionClock: Sendable {
    let fd: Int32
    /// Monotonic milliseconds by which the next request must have arrived; 0 when none is due.
    private let deadline = Atomic<Int64>(0)
    /// Between requests: no head has arrived since the connection opened or was last answered.
    private let headPending = Atomic<Bool>(true)
    /// Shut down to make room for a new connection. Changed under the watcher's lock, so that
    /// two new connections never pick the same one; atomic only to be shared without `@unchecked`.
    private let evictedFlag = Atomic<Bool>(false)
    /// The length of the request target as the request line carried it, measured before
    /// libmicrohttpd decoded it in place (`RequestTarget.measure`); -1: none, or refused.
    private let targetLength = Atomic<Int>(-1)
    /// The address of the NUL where the request-line callback's view of the target ended
    /// (`RequestTarget.cutQuery`); 0: none, or past it already.
    private let targetEnd = Atomic<UInt>(0)

    init(fd: Int32) { self.fd = fd }

    /// Whether the watcher shut this connection down to make room.
    var evicted: Bool { evictedFlag.load(ordering: .relaxed) }
    /// Marks the connection as shut down to make room.
    func markEvicted() { evictedFlag.store(true, ordering: .relaxed) }

    func armDeadline(after milliseconds: Int64) {
        deadline.store(Self.nowMsec() + milliseconds, ordering: .relaxed)
        headPending.store(true, ordering: .relaxed)
    }
    /// The request line was read: its target measured `length` bytes (`RequestTarget.measure`).
    func targetRead(length: Int) { targetLength.store(length, ordering: .relaxed) }
    /// What `targetRead` last noted, for the request whose head has arrived.
    var targetReadLength: Int { targetLength.load(ordering: .relaxed) }
    /// The request-line callback's view of the target ended at `end` (nil: it saw none).
    func targetSeen(upTo end: UnsafePointer<CChar>?) {
        targetEnd.store(end.map { UInt(bitPattern: $0) } ?? 0, ordering: .relaxed)
    }
    /// Whether `pointer`, a name or value libmicrohttpd decodes, lies past what `targetSeen`
    /// noted; true once per request line.
    func readsPastTarget(_ pointer: UnsafePointer<CChar>) -> Bool {
        let end = targetEnd.load(ordering: .relaxed)
        guard end != 0, UInt(bitPattern: pointer) > end else { return false }
        targetEnd.store(0, ordering: .relaxed)
        return true
    }

    /// The request's head has arrived; its body may still be coming.
    func headArrived() { headPending.store(false, ordering: .relaxed) }
    func requestArrived() { deadline.store(0, ordering: .relaxed) }
    /// The rest of a request body must arrive within `milliseconds`, though its head has.
    func armBodyDeadline(after milliseconds: Int64) {
        deadline.store(Self.nowMsec() + milliseconds, ordering: .relaxed)
    }

    /// Waiting for a request head, so a candidate to make room.
    var awaitsHead: Bool { headPending.load(ordering: .relaxed) }

    /// When the next request is due (so, the longer idle, the earlier); 0 while a request is in
    /// progress or waiting suspended.
    var dueMsec: Int64 { deadline.load(ordering: .relaxed) }

    func isLate(_ now: Int64) -> Bool {
        let due = deadline.load(ordering: .relaxed)
        return due != 0 && now > due
    }

    static func nowMsec() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }
}
