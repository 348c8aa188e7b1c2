// The broker's provider, as the routes see it.
import TokenBrokerCore

extension TokenProvider: TokenProviding {
    public typealias Instant = C.Instant

    public var cookie: CookieSettings { configuration.cookie }

    public var forcedRefreshLimit: (attempts: Int, windowSeconds: Int) {
        (configuration.forcedRefreshMaxAttempts, configuration.forcedRefreshWindowSec)
    }

    public var now: C.Instant { clock.now }

    // Until the provider reads once (`read(newerThan:)` in TokenBrokerCore): its two reads, as one.
    public func read(newerThan: UInt64) -> TokenRead<C.Instant> {
        guard configuration.backgroundRefreshEnabled else { return .onDemand }
        let summary = readSummary()
        guard let version = summary.version, version > newerThan, let (token, stale) = peekToken() else {
            return .unavailable(wasPaused: summary.wasPaused)
        }
        return .token(token, stale: stale, secondsLeft: TokenResponseBody.secondsLeft(token, at: clock.now))
    }
}
