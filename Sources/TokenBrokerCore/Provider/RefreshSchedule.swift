/// When a healthy provider fetches its next token.
///
/// The next refresh is due at the earliest of:
/// - `issuedAt + tokenRefreshDelaySec`;
/// - for a token with an expiry, the refresh-ahead point at 75–85 % of its lifetime (jittered);
/// - the expiry minus a safety margin of a tenth of the lifetime, at most 30 s.
public struct RefreshSchedule: Sendable, Equatable {
    /// The longest time between refreshes (`tokenRefreshDelaySec`).
    public var refreshDelay: Duration
    /// Where the refresh-ahead band starts and ends, as fractions of the lifetime.
    public var aheadBand: ClosedRange<Double> = 0.75...0.85
    /// The largest safety margin before expiry.
    public var maximumSafetyMargin: Duration = .seconds(30)

    public init(refreshDelay: Duration) { self.refreshDelay = refreshDelay }

    /// How long after its issue a token should be replaced.
    /// - Parameters:
    ///   - lifetime: the token's lifetime, or nil when it has no expiry.
    ///   - unit: a number in 0..<1 that places the refresh inside the band.
    public func refreshAfter(lifetime: Duration?, unit: Double) -> Duration {
        guard let lifetime, lifetime > .zero else { return refreshDelay }
        let fraction = aheadBand.lowerBound + (aheadBand.upperBound - aheadBand.lowerBound) * unit
        let ahead = lifetime * fraction
        let margin = min(maximumSafetyMargin, lifetime / 10)
        return min(refreshDelay, ahead, lifetime - margin)
    }
}

/// Limits forced refreshes, like Alamofire's `RefreshWindow(interval: 30, maximumAttempts: 5)`.
///
/// A provider has one of its own. The children of a template share their template's
/// (`SharedForcedRefreshWindow`): each attempt then names the child that made it, and one child
/// takes places only up to its share, so that the others' first forced refreshes find room.
public struct ForcedRefreshWindow<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    public var interval: Duration
    public var maximumAttempts: Int
    /// Shared by a template's children: a child that already took a place in the window takes
    /// another only while fewer than `placesForOneChild` are taken, so that one child's callers
    /// leave room for the first forced refresh of the others.
    public var sharedByChildren: Bool
    private var attempts: [Attempt] = []

    private struct Attempt: Sendable {
        var at: Instant
        /// The child that made it, in a shared window (nil in a provider's own).
        var by: TokenRequestValues?
    }

    public init(interval: Duration, maximumAttempts: Int, sharedByChildren: Bool = false) {
        self.interval = interval
        self.maximumAttempts = maximumAttempts
        self.sharedByChildren = sharedByChildren
    }

    /// In a shared window, the places one child can take in it while the others take none: half
    /// of them, rounded up (3 of 5). The rest are for other children's first forced refreshes.
    public var placesForOneChild: Int { (maximumAttempts + 1) / 2 }

    /// Records an attempt at `now` (by the child `child`, in a shared window), or says how long
    /// until one is allowed again.
    public mutating func admit(at now: Instant, by child: TokenRequestValues? = nil) -> Duration? {
        attempts.removeAll { $0.at.duration(to: now) >= interval }
        if let wait = wait(at: now, by: child) { return wait }
        attempts.append(Attempt(at: now, by: child))
        return nil
    }

    /// Counts an attempt made whatever the window said (another broker's, in a fleet; one asked
    /// for before the store's record was read), while the window has room: it holds the
    /// window's places, never more.
    public mutating func count(at now: Instant, by child: TokenRequestValues? = nil) {
        attempts.removeAll { $0.at.duration(to: now) >= interval }
        if attempts.count < maximumAttempts { attempts.append(Attempt(at: now, by: child)) }
    }

    /// How long until `child` may take a place, with the attempts in the window now; nil when it may now.
    private func wait(at now: Instant, by child: TokenRequestValues?) -> Duration? {
        // The attempts in the order they leave the window (they come in that order, but the
        // children of a shared window read their clocks before its lock).
        let leaving = attempts.map { $0.at.advanced(by: interval) }.sorted()
        /// Until fewer than `places` attempts are in the window.
        func untilFewerThan(_ places: Int) -> Duration {
            leaving.count < places ? .zero : now.duration(to: leaving[leaving.count - places])
        }
        let full = untilFewerThan(maximumAttempts)
        var wait = full
        if sharedByChildren, let latest = attempts.filter({ $0.by == child }).map(\.at).max() {
            // A child that holds a place waits until the window is less than its share full,
            // or until its own places have left it (and the window has room).
            let own = max(now.duration(to: latest.advanced(by: interval)), full)
            wait = max(wait, min(untilFewerThan(placesForOneChild), own))
        }
        return wait > .zero ? wait : nil
    }
}

/// The forced-refresh window a template's children share (`ProviderTemplate`), so that the
/// template as a whole makes at most `forcedRefreshMaxAttempts` forced fetches per
/// `forcedRefreshWindowSec`, however many children it has, and a child made again after it was
/// dropped finds the places its predecessor took. Within it, one child takes at most its share
/// while the others take none (`ForcedRefreshWindow.placesForOneChild`).
///
/// Locking: one lock, a leaf: taken inside a child's own lock, and nothing is taken inside it.
public final class SharedForcedRefreshWindow<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    private let window: Lock<ForcedRefreshWindow<Instant>>

    public init(interval: Duration, maximumAttempts: Int) {
        window = Lock(ForcedRefreshWindow(interval: interval, maximumAttempts: maximumAttempts, sharedByChildren: true))
    }

    /// The window of a template with this configuration (`forcedRefreshMaxAttempts` per `forcedRefreshWindowSec`).
    public convenience init(for configuration: ProviderConfiguration) {
        self.init(
            interval: .seconds(configuration.forcedRefreshWindowSec),
            maximumAttempts: configuration.forcedRefreshMaxAttempts)
    }

    /// `ForcedRefreshWindow.admit(at:by:)`, for the child `child`.
    public func admit(at now: Instant, by child: TokenRequestValues) -> Duration? {
        window.withLock { $0.admit(at: now, by: child) }
    }

    /// `ForcedRefreshWindow.count(at:by:)`, for the child `child`.
    public func count(at now: Instant, by child: TokenRequestValues) {
        window.withLock { $0.count(at: now, by: child) }
    }
}
