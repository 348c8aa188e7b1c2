import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// Every fetch has a deadline of its own: no source holds a provider in `refreshing`.
@Suite struct FetchDeadlineTests {
    @Test func aFetchPastItsDeadlineFailsAsTimeoutBacksOffAndItsLateResultIsIgnored() {
        var harness = MachineHarness(ProviderConfiguration(fetchTimeoutSec: 2))
        harness.start()
        #expect(harness.machine.phase(at: harness.now) == .refreshing)
        #expect(harness.machine.nextWakeup?.offset == .seconds(2), "the deadline arms the timer")
        harness.tick(at: .milliseconds(1999))
        #expect(harness.abandoned.isEmpty)
        #expect(harness.machine.phase(at: harness.now) == .refreshing)

        harness.tick(at: .seconds(2))
        #expect(harness.abandoned.map(\.number) == [1])
        #expect(harness.abandoned.first?.error.description == "timeout")
        #expect(harness.machine.lastError?.description == "timeout")
        #expect(harness.machine.phase(at: harness.now) == .expired, "no longer refreshing")
        #expect(harness.nextFetchDelay == .milliseconds(100), "backoff as for any failure")

        // The abandoned fetch answers late, after the retry started: ignored.
        harness.tick(at: .milliseconds(2100))
        #expect(harness.fetchesStarted == 2)
        harness.succeed(accessToken: "late", fetch: 1)
        #expect(harness.machine.cached == nil)
        #expect(harness.machine.phase(at: harness.now) == .refreshing)
        harness.succeed(accessToken: "fresh", fetch: 2)
        #expect(harness.machine.cached?.token.accessToken == "fresh")
        #expect(harness.machine.cached?.version == 1)
        #expect(harness.machine.failures == 0)
        #expect(harness.machine.fetchDeadline == nil, "a finished fetch leaves no deadline")
    }

    @Test func aLateFailureOfAnAbandonedFetchIsIgnoredToo() {
        var harness = MachineHarness(ProviderConfiguration(fetchTimeoutSec: 1))
        harness.start()
        harness.succeed(fetch: 1)
        harness.tick(at: harness.machine.fetchDueAt!.offset)
        #expect(harness.fetchesStarted == 2)
        harness.tick(at: harness.now.offset + .seconds(1))
        #expect(harness.abandoned.map(\.number) == [2])
        #expect(harness.machine.failures == 1)
        harness.record(harness.machine.fetchFailed(.unreachable("late"), fetch: 2, now: harness.now))
        #expect(harness.machine.failures == 1, "counted once, at the deadline")
        #expect(harness.machine.phase(at: harness.now) == .backingOff, "the cached token is served, stale")
    }

    @Test func theDefaultDeadlineIsTheUpstreamTimeoutPlusFiveSecondsOrTenForLocalSources() {
        var upstream = OAuth2SourceConfiguration(tokenURL: "https://issuer.test/token", clientID: "c")
        upstream.upstream.timeoutMsec = 2500
        #expect(ProviderConfiguration(source: .oauth2(upstream)).effectiveFetchTimeout == .milliseconds(7500))
        #expect(
            ProviderConfiguration(source: .file(FileSourceConfiguration(path: "/t"))).effectiveFetchTimeout
                == .seconds(10))
        #expect(ProviderConfiguration().effectiveFetchTimeout == .seconds(10))
        #expect(ProviderConfiguration(fetchTimeoutSec: 3).effectiveFetchTimeout == .seconds(3))
    }

    @Test func fetchTimeoutSecIsReadAndRangeChecked() throws {
        let configuration = try BrokerConfiguration(json: Array(#"{"providers": [{"fetchTimeoutSec": 30}]}"#.utf8))
        #expect(configuration.providers[0].fetchTimeoutSec == 30)
        for bad in ["0", "601", "1.5", "\"5\""] {
            #expect(throws: ConfigurationError.self) {
                try BrokerConfiguration(json: Array(#"{"providers": [{"fetchTimeoutSec": \#(bad)}]}"#.utf8))
            }
        }
    }

    /// The provider on a manual clock: a source that never answers is given up at the deadline,
    /// reported as a `timeout`, retried after backoff, and the next fetch brings the token.
    @Test func aProviderLeavesRefreshingWhenItsSourceNeverAnswers() async {
        let clock = ManualClock()
        let source = ScriptedSource(gated: true)
        let reported = Lock<[String]>([])
        let events = ProviderEvents(fetched: { _, result, _ in
            reported.withLock { $0.append(result.failure?.description ?? "success") }
        })
        let provider = TokenProvider(
            configuration: ProviderConfiguration(fetchTimeoutSec: 5), source: source, clock: clock, jitter: .fixed(0.5),
            events: events)
        let service = Task { await provider.run() }
        defer { service.cancel() }
        let waiter = Task { await provider.onTokenReady(timeout: .seconds(60)) }
        #expect(
            await eventually { source.parkedCount == 1 && provider.status().waiters == 1 && clock.sleeperCount == 1 })
        #expect(provider.status().phase == .refreshing)
        clock.advance(by: .milliseconds(4999))
        #expect(provider.status().phase == .refreshing)
        clock.advance(by: .milliseconds(1))
        #expect(await eventually { provider.status().phase == .expired })
        #expect(provider.status().lastError?.description == "timeout")
        #expect(reported.withLock { $0 } == ["timeout"])

        // The retry, 100 ms later, finds the gate open: the parked fetch and the retry both
        // answer, and only the retry's token is taken.
        source.open()
        #expect(await eventually { clock.sleeperCount >= 1 })
        clock.advance(by: .milliseconds(100))
        guard case .token(let token, stale: false) = await waiter.value else {
            Issue.record("the waiter should get the retry's token")
            return
        }
        #expect(token.version == 1)
        #expect(token.token.accessToken == "token-2", "the abandoned fetch's token-1 is ignored")
        #expect(await eventually { reported.withLock { $0 } == ["timeout", "success"] })
    }
}
