import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// A request's one read of a provider (`read(newerThan:)`): the token with what `/token` shows
/// of it, or why there is none, and the `backgroundRefreshEnabled` rule.
@Suite struct TokenReadTests {
    typealias Instant = ManualClock.Instant

    @Test func aReadGivesTheTokenOnlyWhenNewerThanAskedAndSaysStaleAndSecondsLeft() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed(lifetime: .seconds(100))
        harness.now = Instant(offset: .milliseconds(10_500))
        guard
            case .token(let token, let stale, let secondsLeft) = harness.machine.read(newerThan: 0, now: harness.now)
                .read
        else {
            Issue.record("a valid token newer than 0 is served")
            return
        }
        #expect(token.version == 1 && !stale && secondsLeft == 90, "89.5 s left reads 90")
        guard case .unavailable(wasPaused: false, _) = harness.machine.read(newerThan: 1, now: harness.now).read else {
            Issue.record("version 1 is not newer than 1")
            return
        }
        // A failed refresh keeps the token, stale.
        harness.tick(at: harness.machine.fetchDueAt!.offset)
        harness.fail()
        guard case .token(_, stale: true, _) = harness.machine.read(now: harness.now).read else {
            Issue.record("the token is served stale while refresh fails")
            return
        }
    }

    @Test func aReadSaysWhetherTheProviderStillAwaitsItsFirstToken() {
        func awaiting(_ harness: MachineHarness, newerThan: UInt64 = 0) -> Bool? {
            var machine = harness.machine
            guard
                case .unavailable(_, let awaitingFirstToken) = machine.read(newerThan: newerThan, now: harness.now).read
            else { return nil }
            return awaitingFirstToken
        }
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        #expect(awaiting(harness) == true, "before the first fetch ends")
        harness.fail()
        #expect(awaiting(harness) == false, "the first fetch failed")
        var held = MachineHarness(ProviderConfiguration())
        held.start()
        held.succeed()
        #expect(awaiting(held, newerThan: 1) == false, "a token was held")
    }

    @Test func aTokenWithoutExpiryHasNoSecondsLeft() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed(lifetime: nil)
        guard case .token(_, _, secondsLeft: nil) = harness.machine.read(now: harness.now).read else {
            Issue.record("a token without expiry reads nil seconds left")
            return
        }
    }

    @Test func aReadOfAPausedProviderWithAnExpiredTokenSaysItWasPausedAndStartsAFetch() {
        var harness = MachineHarness.pausedWithAnExpiredToken()
        let (read, actions) = harness.machine.read(now: harness.now)
        guard case .unavailable(wasPaused: true, _) = read else {
            Issue.record("the read found the provider paused")
            return
        }
        #expect(actions.contains { if case .startFetch = $0 { true } else { false } })
        #expect(!harness.machine.isPaused)
    }

    @Test func withoutBackgroundRefreshAReadSaysOnDemandAndChangesNothing() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false))
        let id = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        harness.succeed()
        #expect(harness.outcomes[id] != nil)
        let (read, actions) = harness.machine.read(now: harness.now)
        guard case .onDemand(let cached) = read else {
            Issue.record("without background refresh every request waits for its own fetch")
            return
        }
        #expect(actions.isEmpty && harness.machine.isFetching == false)
        // The proxy reuses the last token while it is valid, and only then.
        #expect(cached?.version == 1)
        harness.now = Instant(offset: .seconds(901))
        guard case .onDemand(cached: nil) = harness.machine.read(now: harness.now).read else {
            Issue.record("an expired token is not offered for reuse")
            return
        }
    }

    /// A provider that has shut down serves nothing and starts nothing: `.unavailable` with
    /// background refresh; `.onDemand` without, whose waiter then hears `.shuttingDown`.
    @Test func aProviderThatShutDownReadsAsBefore() async {
        let cached = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: ManualClock(), jitter: .fixed(0.5))
        cached.shutDown()
        guard case .unavailable(wasPaused: false, _) = cached.read() else {
            Issue.record("a provider that shut down has no token to serve")
            return
        }
        let onDemand = TokenProvider(
            configuration: ProviderConfiguration(backgroundRefreshEnabled: false), source: ScriptedSource(),
            clock: ManualClock())
        onDemand.shutDown()
        guard case .onDemand = onDemand.read() else {
            Issue.record("the rule holds after shutdown")
            return
        }
        guard case .shuttingDown = await onDemand.onTokenReady(timeout: .seconds(30), onDemand: true) else {
            Issue.record("an on-demand waiter hears the provider stopped")
            return
        }
    }
}
