// A provider of the test's making: it answers reads, refreshes and status as told, and keeps the
// waiters the routes register so that the test ends them.
import Synchronization
import TokenBrokerAPI

@testable import TokenBrokerCore

/// A `TokenProviding` whose every answer the test sets, recording what the routes asked of it.
final class FakeProvider: TokenProviding {
    typealias Instant = ContinuousClock.Instant
    typealias Outcome = ProviderStateMachine<Instant>.WaitOutcome

    /// A waiter a route registered.
    struct Waiter: Sendable {
        var after: UInt64?
        var onDemand: Bool
        var forRefresh: Bool
        var deadline: Instant
        var completion: @Sendable (Outcome) -> Void
    }

    /// What the routes asked, and what the fake answers.
    struct State: Sendable {
        var read: TokenRead<Instant> = .unavailable(wasPaused: false, awaitingFirstToken: false)
        var reads: [UInt64] = []
        var refresh: ProviderStateMachine<Instant>.ForcedRefreshDecision = .refreshing(after: nil)
        var refreshes: [UInt64?] = []
        /// The versions `refreshEarly` was asked to replace, in order.
        var earlyRefreshes: [UInt64] = []
        var status: ProviderStatus
        var waiters: [UInt64: Waiter] = [:]
        var removed: [UInt64] = []
        var nextID: UInt64 = 1
    }

    let name: String
    let cookie: CookieSettings
    let forcedRefreshLimit: (attempts: Int, windowSeconds: Int) = (5, 30)
    let state: Mutex<State>

    init(name: String = "default", cookie: CookieSettings = CookieSettings()) {
        self.name = name
        self.cookie = cookie
        state = Mutex(State(status: FakeProvider.status(name: name)))
    }

    /// A status as a provider would publish it.
    static func status(
        name: String, phase: ProviderPhase = .expired, version: UInt64? = nil, stale: Bool = false,
        lastError: TokenFetchError? = nil,
        backgroundRefresh: Bool = true, heldOffFor: Duration? = nil
    ) -> ProviderStatus {
        ProviderStatus(
            name: name, phase: phase, version: version, stale: stale, expiresIn: nil, lastError: lastError,
            consecutiveFailures: lastError == nil ? 0 : 1, waiters: 0, backgroundRefresh: backgroundRefresh,
            heldOffFor: heldOffFor)
    }

    var now: Instant { ContinuousClock.now }

    func read(newerThan: UInt64) -> TokenRead<Instant> {
        state.withLock { state in
            state.reads.append(newerThan)
            if case .token(let token, _, _) = state.read, token.version <= newerThan {
                return .unavailable(wasPaused: false, awaitingFirstToken: false)
            }
            return state.read
        }
    }

    func addWaiter(
        after: UInt64?, deadline: Instant, onDemand: Bool, forRefresh: Bool,
        completion: @escaping @Sendable (Outcome) -> Void
    ) -> UInt64 {
        state.withLock { state in
            let id = state.nextID
            state.nextID += 1
            state.waiters[id] = Waiter(
                after: after, onDemand: onDemand, forRefresh: forRefresh, deadline: deadline, completion: completion)
            return id
        }
    }

    func removeWaiter(_ id: UInt64) {
        state.withLock { state in
            state.waiters[id] = nil
            state.removed.append(id)
        }
    }

    func forceRefresh(rejected: UInt64?) -> ProviderStateMachine<Instant>.ForcedRefreshDecision {
        state.withLock { state in
            state.refreshes.append(rejected)
            return state.refresh
        }
    }

    func refreshEarly(replacing version: UInt64) -> ProviderStateMachine<Instant>.ForcedRefreshDecision {
        state.withLock { state in
            state.earlyRefreshes.append(version)
            return state.refresh
        }
    }

    func status() -> ProviderStatus { state.withLock { $0.status } }

    func deadline(in duration: Duration) -> Instant { ContinuousClock.now.advanced(by: duration) }

    /// The only waiter registered, if exactly one is.
    var onlyWaiter: (id: UInt64, waiter: Waiter)? {
        state.withLock { state in state.waiters.count == 1 ? state.waiters.first.map { ($0.key, $0.value) } : nil }
    }

    /// Ends every waiter with `outcome`, as the provider would.
    func completeWaiters(_ outcome: Outcome) {
        let waiters = state.withLock { state in
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.completion(outcome) }
    }

    /// A token as the provider would cache it: version `version`, without expiry unless `lifetime` says.
    static func token(_ accessToken: String = "tok-1", version: UInt64 = 1, lifetime: Duration? = nil) -> CachedToken<
        Instant
    > {
        let now = ContinuousClock.now
        return CachedToken(
            token: FetchedToken(accessToken: accessToken, lifetime: lifetime), version: version, issuedAt: now,
            expiresAt: lifetime.map { now.advanced(by: $0) },
            issuedAtDate: WallTime(timeIntervalSince1970: 1_800_000_000))
    }
}
