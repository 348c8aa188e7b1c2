/// What a provider is doing, as `/readyz` (`state`) and the `token_broker_provider_state` metric name it.
public enum ProviderPhase: String, Sendable, CaseIterable {
    /// A valid token, and refresh succeeding.
    case fresh
    /// An upstream fetch is in flight.
    case refreshing
    /// Refresh fails; the valid token is served, stale, between retries.
    case backingOff = "backing_off"
    /// Refresh paused while nobody read; the next read resumes it.
    case paused
    /// No valid token.
    case expired
}
