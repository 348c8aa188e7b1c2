import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// Drives a `ProviderStateMachine` by hand: time moves only when the test says, and every
/// action is recorded, so each rule can be checked at exact instants.
struct MachineHarness {
    typealias Instant = ManualClock.Instant
    typealias Machine = ProviderStateMachine<Instant>

    var machine: Machine
    var now = Instant(offset: .zero)
    /// Fetches the machine asked for so far.
    var fetchesStarted = 0
    /// Instants at which each fetch was asked for.
    var fetchTimes: [Duration] = []
    var outcomes: [UInt64: Machine.WaitOutcome] = [:]
    /// Fetches given up at their deadline, with the error they failed with.
    var abandoned: [(number: UInt64, error: TokenFetchError)] = []
    /// Tokens handed over so far, so that each `succeed()` brings a new one unless told otherwise.
    var tokensIssued = 0

    init(_ configuration: ProviderConfiguration, jitter: Jitter = .fixed(0.5)) {
        machine = Machine(configuration: configuration, now: now, jitter: jitter)
    }

    /// A harness whose machine has a store, as a provider with one makes it: it waits for
    /// `storeLoaded` before any fetch. `versionsAfter`: as a template's child made again, or a
    /// replacement at a reload, numbers its tokens after it.
    static func awaitingStore(
        _ configuration: ProviderConfiguration = ProviderConfiguration(tokenRefreshDelaySec: 300),
        jitter: Jitter = .fixed(0.5), versionsAfter: UInt64 = 0
    ) -> MachineHarness {
        var harness = MachineHarness(configuration, jitter: jitter)
        harness.machine = Machine(
            configuration: configuration, now: harness.now, jitter: jitter, awaitingStore: true,
            versionsAfter: versionsAfter)
        return harness
    }

    mutating func record(_ actions: [Machine.Action]) {
        for action in actions {
            switch action {
            case .startFetch:
                fetchesStarted += 1
                fetchTimes.append(now.offset)
            case .complete(let ids, let outcome):
                for id in ids { outcomes[id] = outcome }
            case .abandonFetch(let number, let error):
                abandoned.append((number, error))
            }
        }
    }

    mutating func start() { record(machine.start(now: now)) }

    /// Moves to `offset` and lets the machine's timer fire there.
    mutating func tick(at offset: Duration) {
        now = Instant(offset: offset)
        record(machine.tick(now: now))
    }

    /// Fires the timer at each planned wakeup until `offset`, as the provider's timer would.
    mutating func runTimers(until offset: Duration, answering answer: (inout MachineHarness) -> Void = { _ in }) {
        while let wake = machine.nextWakeup, wake.offset <= offset {
            let before = fetchesStarted
            tick(at: wake.offset)
            if fetchesStarted > before { answer(&self) }
        }
        now = Instant(offset: offset)
    }

    /// The fetch in flight brings a new token, or `accessToken` when given (the same one again, say).
    mutating func succeed(lifetime: Duration? = .seconds(900), accessToken: String? = nil, fetch: UInt64? = nil) {
        tokensIssued += 1
        let token = FetchedToken(accessToken: accessToken ?? "token-\(tokensIssued)", lifetime: lifetime)
        record(machine.fetchSucceeded(token, fetch: fetch, now: now, wallTime: WallTime(timeIntervalSince1970: 0)))
    }

    mutating func fail(_ error: TokenFetchError = .serverError("boom", httpStatus: 503)) {
        record(machine.fetchFailed(error, now: now))
    }

    /// A request's read at the current instant (`ProviderStateMachine.read`), its actions recorded:
    /// the token it would serve, if any.
    mutating func read(newerThan: UInt64 = 0) -> (token: Machine.Token?, stale: Bool) {
        let result = machine.read(newerThan: newerThan, now: now)
        record(result.actions)
        guard case .token(let token, let stale, _) = result.read else { return (nil, false) }
        return (token, stale)
    }

    mutating func wait(after: UInt64?, for timeout: Duration, onDemand: Bool = false) -> UInt64 {
        let (id, actions) = machine.addWaiter(
            after: after, deadline: now.advanced(by: timeout), onDemand: onDemand, now: now)
        record(actions)
        return id
    }

    /// A forced refresh of `rejected` at the current instant, its actions recorded.
    mutating func forceRefresh(rejected: UInt64?, early: Bool = false) -> Machine.ForcedRefreshDecision {
        let (decision, actions) = machine.forceRefresh(rejected: rejected, now: now, early: early)
        record(actions)
        return decision
    }

    /// The wait before the next planned fetch, measured from now.
    var nextFetchDelay: Duration? { machine.fetchDueAt.map { now.duration(to: $0) } }

    /// A provider that paused while idle (`tokenRefreshDelaySec: 10`) after two fetches of
    /// 100 s tokens, with the clock at 500 s, long after its token expired.
    static func pausedWithAnExpiredToken() -> MachineHarness {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 10))
        harness.start()
        harness.succeed(lifetime: .seconds(100))
        harness.tick(at: .seconds(10))
        harness.succeed(lifetime: .seconds(100))
        harness.tick(at: .seconds(20))
        #expect(harness.machine.isPaused)
        harness.now = .init(offset: .seconds(500))
        return harness
    }
}
