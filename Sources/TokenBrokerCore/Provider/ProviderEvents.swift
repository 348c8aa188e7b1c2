/// Hooks through which a provider reports what it did, for logs and metrics.
public struct ProviderEvents: Sendable {
    /// A fetch ended: the provider's name, the token and its version or the error, and how long it took.
    public var fetched: @Sendable (String, Result<(FetchedToken, UInt64), TokenFetchError>, Duration) -> Void
    /// A forced refresh was refused by the refresh window.
    public var excessiveRefresh: @Sendable (String) -> Void

    /// Hooks that do nothing unless given.
    public init(
        fetched: @escaping @Sendable (String, Result<(FetchedToken, UInt64), TokenFetchError>, Duration) -> Void = {
            _, _, _ in
        },
        excessiveRefresh: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.fetched = fetched
        self.excessiveRefresh = excessiveRefresh
    }
}
