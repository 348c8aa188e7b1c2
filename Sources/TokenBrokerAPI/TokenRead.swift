// Until the provider reads once: the shape of its one read (TokenBrokerCore then defines it).
import TokenBrokerCore

/// What a request finds in a provider.
public enum TokenRead<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    /// A valid token newer than asked, flagged stale while refresh fails, with whole seconds left.
    case token(CachedToken<Instant>, stale: Bool, secondsLeft: Int?)
    /// No valid token newer than asked. `wasPaused`: refresh was paused while idle and this read resumed it.
    case unavailable(wasPaused: Bool)
    /// Background refresh is off: the caller waits for a fetch made for it (`addWaiter(onDemand: true)`).
    case onDemand
}
