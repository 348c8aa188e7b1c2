/// What a request finds in a provider, read under one lock (`TokenProvider.read(newerThan:)`).
public enum TokenRead<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    /// A valid token newer than asked, flagged stale while refresh fails, with whole seconds left
    /// (rounded up; nil when it does not expire) as `/token` shows them.
    case token(CachedToken<Instant>, stale: Bool, secondsLeft: Int?)
    /// No valid token newer than asked. `wasPaused`: refresh was paused while idle and this read
    /// resumed it. `awaitingFirstToken`: the provider has never held a token and its first fetch
    /// has not failed, read under the same lock as the rest, so that a route deciding whether to
    /// wait for the first token cannot see a fetch end between two looks.
    case unavailable(wasPaused: Bool, awaitingFirstToken: Bool)
    /// Background refresh is off: `/token` waits for a fetch made for it (`addWaiter(onDemand: true)`).
    /// `cached` is the last fetched token while still valid, which the proxy reuses until it expires.
    case onDemand(cached: CachedToken<Instant>?)
}
