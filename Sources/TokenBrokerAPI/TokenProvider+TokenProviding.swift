// The broker's provider, as the routes see it.
import TokenBrokerCore

/// `read(newerThan:)`, the waiters, the retrier, `status()` and `deadline(in:)` are the provider's own.
extension TokenProvider: TokenProviding {
    public typealias Instant = C.Instant

    /// `configuration.cookie`.
    public var cookie: CookieSettings { configuration.cookie }

    /// `configuration.forcedRefreshMaxAttempts` and `forcedRefreshWindowSec`.
    public var forcedRefreshLimit: (attempts: Int, windowSeconds: Int) {
        (configuration.forcedRefreshMaxAttempts, configuration.forcedRefreshWindowSec)
    }

    /// `clock.now`.
    public var now: C.Instant { clock.now }
}
