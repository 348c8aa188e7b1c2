import Testing
import TokenBrokerCore

/// A version is a new token: the same access token fetched again keeps its version.
@Suite struct TokenVersionTests {
    @Test func theSameTokenAgainKeepsItsVersionWakesNoWaiterAndOnlyUpdatesTheExpiry() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        harness.succeed(lifetime: .seconds(100), accessToken: "same")
        #expect(harness.machine.cached?.version == 1)
        let waiter = harness.wait(after: 1, for: .seconds(3600))

        harness.tick(at: harness.machine.fetchDueAt!.offset)
        #expect(harness.fetchesStarted == 2)
        let refetchedAt = harness.now
        harness.succeed(lifetime: .seconds(100), accessToken: "same")
        #expect(harness.machine.cached?.version == 1, "not a new token")
        #expect(harness.outcomes[waiter] == nil, "a waiter after version 1 is not woken for it")
        #expect(harness.machine.cached?.issuedAt == Instant(offset: .zero), "issued when first seen")
        #expect(harness.machine.cached?.expiresAt == refetchedAt.advanced(by: .seconds(100)), "the expiry just learned")
        #expect(
            harness.machine.cached?.token.lifetime
                == Instant(offset: .zero).duration(to: refetchedAt.advanced(by: .seconds(100))))
        #expect(harness.machine.fetchDueAt != nil, "refresh goes on as after any fetch")

        harness.tick(at: harness.machine.fetchDueAt!.offset)
        harness.succeed(lifetime: .seconds(100), accessToken: "other")
        #expect(harness.machine.cached?.version == 2)
        guard case .token(let token, stale: false)? = harness.outcomes[waiter] else {
            Issue.record("a new token wakes the waiter")
            return
        }
        #expect(token.version == 2 && token.token.accessToken == "other")
    }

    @Test func theSameTokenWithALaterExpiryServesAgainUnderItsVersionAfterItExpired() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: true, pauseWhenIdle: false))
        harness.start()
        harness.succeed(lifetime: .seconds(10), accessToken: "same")
        // The refresh fails until the token has expired.
        harness.tick(at: harness.machine.fetchDueAt!.offset)
        harness.fail()
        harness.now = Instant(offset: .seconds(20))
        #expect(harness.read().token == nil)
        let waiter = harness.wait(after: nil, for: .seconds(60))
        #expect(harness.outcomes[waiter] == nil)
        #expect(harness.machine.fetchDueAt! <= harness.now, "the retry is due")
        harness.tick(at: .seconds(20))
        #expect(harness.fetchesStarted == 3)
        harness.succeed(lifetime: .seconds(900), accessToken: "same")
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("a waiter with nothing valid is answered by the same token made valid again")
            return
        }
        #expect(token.version == 1)
        #expect(harness.read().token?.version == 1)
    }

    @Test func onDemandCallersAreAnsweredByTheirFetchEvenWhenItBringsTheSameToken() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false))
        let first = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        #expect(harness.fetchesStarted == 1)
        harness.succeed(accessToken: "same")
        let second = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        #expect(harness.fetchesStarted == 2, "on demand, every call fetches")
        harness.succeed(accessToken: "same")
        for id in [first, second] {
            guard case .token(let token, _)? = harness.outcomes[id] else {
                Issue.record("waiter \(id) should have its token")
                continue
            }
            #expect(token.version == 1)
        }
    }

    @Test func aForcedRefreshThatBringsTheSameTokenEndsItsOwnWaitsButNoLongPoll() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed(accessToken: "same")
        guard case .refreshing(after: 1) = harness.forceRefresh(rejected: 1) else {
            Issue.record("version 1 is current: a refresh starts")
            return
        }
        #expect(harness.fetchesStarted == 2)
        let longPoll = harness.wait(after: 1, for: .seconds(60))
        let (refresh, actions) = harness.machine.addWaiter(
            after: 1, deadline: harness.now.advanced(by: .seconds(60)), forRefresh: true, now: harness.now)
        harness.record(actions)
        #expect(harness.outcomes[refresh] == nil, "the refresh is under way")
        harness.succeed(accessToken: "same")
        guard case .token(let token, stale: false)? = harness.outcomes[refresh] else {
            Issue.record("the refresh's own wait ends with its token")
            return
        }
        #expect(token.version == 1)
        #expect(harness.outcomes[longPoll] == nil, "a long-poll after version 1 still waits for a new token")

        // A refresh whose fetch finished before its wait was registered is answered at once.
        _ = harness.forceRefresh(rejected: 1)
        harness.succeed(accessToken: "same")
        let (late, lateActions) = harness.machine.addWaiter(
            after: 1, deadline: harness.now.advanced(by: .seconds(60)), forRefresh: true, now: harness.now)
        harness.record(lateActions)
        guard case .token(let again, _)? = harness.outcomes[late] else {
            Issue.record("a finished refresh answers its wait at once")
            return
        }
        #expect(again.version == 1)
    }

    private typealias Instant = MachineHarness.Instant
}
