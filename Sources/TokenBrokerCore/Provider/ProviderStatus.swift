/// A provider's published state: what readiness, metrics and error answers read.
public struct ProviderStatus: Sendable {
    /// The provider's configured name.
    public var name: String
    /// What the provider is doing; its raw value is `/readyz`'s `state`.
    public var phase: ProviderPhase
    /// The valid token's version, or nil when there is none.
    public var version: UInt64?
    /// A valid token is served while refresh fails.
    public var stale: Bool
    /// The valid token's remaining life, or nil without one or for a token without expiry.
    public var expiresIn: Duration?
    /// The last fetch's error, until a fetch succeeds.
    public var lastError: TokenFetchError?
    /// Failed fetches since the last success.
    public var consecutiveFailures: Int
    /// Requests waiting for a token (long-polls, on-demand fetches, forced refreshes).
    public var waiters: Int
    /// `backgroundRefreshEnabled`.
    public var backgroundRefresh: Bool
    /// Whether a fetch ever brought a token (valid or not now): a template's child that never
    /// did makes its first requests wait for one, since it was made for them.
    public var everHeldToken: Bool = false
    /// How long the issuer's `Retry-After` still holds fetches off; nil: it does not (any more).
    public var heldOffFor: Duration? = nil

    /// Whether the provider can answer `/token` now.
    public var hasValidToken: Bool { version != nil }

    /// What `/readyz` reports: with background refresh, a valid cached token (a paused provider
    /// counts while its token lasts); on demand, that the last fetch, if any, succeeded.
    public var isReady: Bool { backgroundRefresh ? hasValidToken : lastError == nil }
}
