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
public struct ForcedRefreshWindow<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    public var interval: Duration
    public var maximumAttempts: Int
    private var attempts: [Instant] = []

    public init(interval: Duration, maximumAttempts: Int) {
        self.interval = interval
        self.maximumAttempts = maximumAttempts
    }

    /// Records an attempt at `now`, or says how long until one is allowed again.
    public mutating func admit(at now: Instant) -> Duration? {
        attempts.removeAll { $0.duration(to: now) >= interval }
        if attempts.count >= maximumAttempts, let oldest = attempts.first {
            return interval - oldest.duration(to: now)
        }
        attempts.append(now)
        return nil
    }
}
