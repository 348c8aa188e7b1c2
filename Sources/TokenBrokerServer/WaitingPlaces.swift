import Synchronization

/// The places a listener keeps for requests that wait: those whose handler deferred the answer
/// (`HTTPReply.deferred`: a long-poll, a wait for a first or on-demand token, a refresh's wait,
/// a proxied exchange). A waiting request holds its connection until it is answered, and the
/// connection watcher never closes it to make room, so without a cap one client could hold
/// every connection the listener takes, and the requests answered at once would find none.
///
/// Seven eighths of the connection limit may wait (`limit(connectionLimit:)`); the eighth left
/// is for requests answered at once, and the connection watcher keeps making room in it by
/// closing idle connections (past fifteen sixteenths). A request that would wait past the cap
/// is refused at once (`ServerRefusal.tooManyWaiting`).
///
/// One atomic counter: a request that waits pays a compare-and-exchange to take its place and
/// an atomic subtraction to give it back; a request answered at once pays nothing.
final class WaitingPlaces: Sendable {
    /// The most requests that may wait at once.
    let limit: Int
    private let held = Atomic<Int>(0)
    private let refusals = Atomic<Int>(0)

    init(connectionLimit: Int) {
        limit = Self.limit(connectionLimit: connectionLimit)
    }

    /// Seven eighths of `connectionLimit`, rounded down, and at least 1: 14,000 of the default
    /// 16,000; 14 of the smallest the configuration takes, 16.
    static func limit(connectionLimit: Int) -> Int { max(1, connectionLimit * 7 / 8) }

    /// Requests waiting now.
    var count: Int { held.load(ordering: .relaxed) }

    /// Requests refused since start because every place was taken.
    var refused: Int { refusals.load(ordering: .relaxed) }

    /// Takes a place; false, counting a refusal, when all are taken. Exact under concurrency:
    /// the count never passes `limit`, not even for a moment, so that two requests never both
    /// take the last place and a refused one never makes another look refused.
    func take() -> Bool {
        var current = held.load(ordering: .relaxed)
        while current < limit {
            let (exchanged, found) = held.weakCompareExchange(
                expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return true }
            current = found
        }
        refusals.wrappingAdd(1, ordering: .relaxed)
        return false
    }

    /// Gives back a place `take` gave; once per place taken.
    func giveBack() {
        held.wrappingSubtract(1, ordering: .relaxed)
    }
}
