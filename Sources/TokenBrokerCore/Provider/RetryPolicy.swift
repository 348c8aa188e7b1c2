/// How long to wait after a failed fetch: exponential backoff, then a slow steady cadence.
///
/// After the `n`th consecutive failure (n starts at 1) the wait is
///
///     n ≤ maxRetryCount:  base × multiplier^(n-1) × (1 ± jitter), capped at `maximumBackoff`
///     n > maxRetryCount:  slowDelay                       (maxErrorTokenRefreshDelayMsec)
///
/// and never shorter than the issuer's `Retry-After`. With the defaults (base 100 ms,
/// multiplier 2, jitter ±20 %, maxRetryCount 5, slowDelay 5 s) the nominal waits are:
///
/// | failure | 1 | 2 | 3 | 4 | 5 | 6 | 7 … |
/// |---|---|---|---|---|---|---|---|
/// | wait | 100 ms | 200 ms | 400 ms | 800 ms | 1.6 s | 5 s | 5 s |
public struct RetryPolicy: Sendable, Equatable {
    /// The first wait. The WAF SDK's value: 100 ms.
    public var base: Duration = .milliseconds(100)
    /// Growth per failure: 2.
    public var multiplier: Double = 2
    /// The fraction by which each backoff wait is spread either way: 0.2.
    public var jitter: Double = 0.2
    /// Backoff waits are never longer than this: 30 s.
    public var maximumBackoff: Duration = .seconds(30)
    /// How many failures are followed by an exponential wait (`maxRetryCount`).
    public var maxRetryCount: Int
    /// The steady wait once backoff is exhausted (`maxErrorTokenRefreshDelayMsec`).
    public var slowDelay: Duration

    public init(maxRetryCount: Int, slowDelay: Duration) {
        self.maxRetryCount = maxRetryCount
        self.slowDelay = slowDelay
    }

    /// Whether the `failures`th consecutive failure has used up the exponential retries.
    public func isExhausted(afterFailures failures: Int) -> Bool { failures > maxRetryCount }

    /// The wait after the `failures`th consecutive failure.
    /// - Parameters:
    ///   - failures: consecutive failures so far, from 1.
    ///   - unit: a number in 0..<1 that places the wait inside its jitter band; 0.5 is the nominal wait.
    ///   - retryAfter: the issuer's `Retry-After`, honoured when it is longer.
    public func delay(afterFailures failures: Int, unit: Double, retryAfter: Duration? = nil) -> Duration {
        var wait: Duration
        if isExhausted(afterFailures: failures) {
            wait = slowDelay
        } else {
            var factor = 1.0
            for _ in 1..<max(1, failures) { factor *= multiplier }
            let spread = 1 + jitter * (2 * unit - 1)
            wait = min(base * (factor * spread), maximumBackoff)
        }
        if let retryAfter, retryAfter > wait { wait = retryAfter }
        return wait
    }
}

/// A source of numbers in 0..<1 that spread retries and refreshes apart.
///
/// Production uses `.random`; tests pin it so that every wait is exactly predictable.
public struct Jitter: Sendable {
    public let next: @Sendable () -> Double
    public init(_ next: @escaping @Sendable () -> Double) { self.next = next }
    public static var random: Jitter { Jitter { Double.random(in: 0..<1) } }
    public static func fixed(_ unit: Double) -> Jitter { Jitter { unit } }
}
