/// Hooks through which a provider reports what it did, for logs and metrics.
public struct ProviderEvents: Sendable {
    /// A fetch ended: the provider's name, the token and its version or the error, and how long it took.
    public var fetched: @Sendable (String, Result<(FetchedToken, UInt64), TokenFetchError>, Duration) -> Void
    /// A forced refresh was refused by the refresh window.
    public var excessiveRefresh: @Sendable (String) -> Void
    /// The store's record was read at start: what the store said, and whether the provider
    /// serves it (false for an expired record).
    public var storeLoaded: @Sendable (String, StoreLoad, Bool) -> Void
    /// A token another broker of the fleet fetched is served (a shared store's record).
    public var fromFleet: @Sendable (String, StoredToken) -> Void
    /// A record another broker of the fleet stored is not served: its token breaks this
    /// provider's rules (`TokenRules.problem(with:)`, whose words are the last argument).
    public var refusedFromFleet: @Sendable (String, StoredToken, String) -> Void
    /// A fetch this broker made through a shared store: for the fleet, or alone.
    public var fetchedFor: @Sendable (String, SharedFetch.Origin) -> Void

    /// Hooks that do nothing unless given.
    public init(
        fetched: @escaping @Sendable (String, Result<(FetchedToken, UInt64), TokenFetchError>, Duration) -> Void = {
            _, _, _ in
        },
        excessiveRefresh: @escaping @Sendable (String) -> Void = { _ in },
        storeLoaded: @escaping @Sendable (String, StoreLoad, Bool) -> Void = { _, _, _ in },
        fromFleet: @escaping @Sendable (String, StoredToken) -> Void = { _, _ in },
        refusedFromFleet: @escaping @Sendable (String, StoredToken, String) -> Void = { _, _, _ in },
        fetchedFor: @escaping @Sendable (String, SharedFetch.Origin) -> Void = { _, _ in }
    ) {
        self.fromFleet = fromFleet
        self.refusedFromFleet = refusedFromFleet
        self.fetchedFor = fetchedFor
        self.fetched = fetched
        self.excessiveRefresh = excessiveRefresh
        self.storeLoaded = storeLoaded
    }
}
