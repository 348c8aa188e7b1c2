// What the routes of both listeners need from a provider, so that each route runs in a unit
// test against a provider of the test's making; `TokenProvider` is the broker's.
import TokenBrokerCore

/// A provider as the routes see it: one read for the request path, waiters for suspended
/// requests, the retrier, and the status that readiness, metrics and error texts report.
///
/// - Important: the token routes call these on a server thread: none may block.
public protocol TokenProviding: AnyObject, Sendable {
    /// The clock's instants the provider keeps its tokens' times in.
    associatedtype Instant: InstantProtocol where Instant.Duration == Duration

    /// The provider's configured name.
    var name: String { get }
    /// How token answers also carry the token as a cookie.
    var cookie: CookieSettings { get }
    /// Forced refreshes allowed per window, for the 429 text (`forcedRefreshMaxAttempts`, `forcedRefreshWindowSec`).
    var forcedRefreshLimit: (attempts: Int, windowSeconds: Int) { get }
    /// Now, on the provider's clock.
    var now: Instant { get }

    /// The request path's one read: a valid token newer than `newerThan`, or why there is none.
    /// Counts as activity (it wakes a provider paused while idle).
    func read(newerThan: UInt64) -> TokenRead<Instant>
    /// Registers a waiter that ends through `completion`, at the latest at `deadline`; returns
    /// an id for `removeWaiter`.
    /// - Parameters:
    ///   - onDemand: fetch a token for this waiter (background refresh is off).
    ///   - forRefresh: the wait of a forced refresh, which its token ends even when it is the same token again.
    func addWaiter(
        after: UInt64?, deadline: Instant, onDemand: Bool, forRefresh: Bool,
        completion: @escaping @Sendable (ProviderStateMachine<Instant>.WaitOutcome) -> Void
    ) -> UInt64
    /// Forgets a waiter whose request went away; its completion is never called.
    func removeWaiter(_ id: UInt64)
    /// The retrier: `rejected` is the version a downstream service refused.
    func forceRefresh(rejected: UInt64?) -> ProviderStateMachine<Instant>.ForcedRefreshDecision
    /// A refresh ahead of the schedule of the valid token `version`, which a client treats as
    /// expired sooner (a cloud SDK's margin): counted apart from the retrier's forced refreshes.
    func refreshEarly(replacing version: UInt64) -> ProviderStateMachine<Instant>.ForcedRefreshDecision
    /// What the provider is doing now.
    func status() -> ProviderStatus
    /// The instant `duration` from now on the provider's clock.
    func deadline(in duration: Duration) -> Instant
}

extension TokenProviding {
    /// `read(newerThan: 0)`: any valid token.
    public func read() -> TokenRead<Instant> { read(newerThan: 0) }
}
