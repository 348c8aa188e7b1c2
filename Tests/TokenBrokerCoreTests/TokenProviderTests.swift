import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// The provider's driver on a manual clock: single flight, waiters, cancellation, timers.
@Suite struct TokenProviderTests {
    /// Starts `provider.run()` in a task the test owns, and stops it at the end.
    private func withRunning<T>(_ provider: TokenProvider<ManualClock>, _ body: () async throws -> T) async rethrows
        -> T
    {
        let service = Task { await provider.run() }
        defer { service.cancel() }
        return try await body()
    }

    @Test func singleFlightUnderAThousandConcurrentCallersAtColdStart() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: ManualClock(), jitter: .fixed(0.5))
        await withRunning(provider) {
            let versions = await withTaskGroup(of: UInt64?.self) { group in
                for _ in 0..<1000 {
                    group.addTask {
                        if case .token(let token, _) = await provider.onTokenReady(timeout: .seconds(30)) {
                            return token.version
                        }
                        return nil
                    }
                }
                #expect(await eventually { provider.status().waiters == 1000 })
                source.open()
                return await group.reduce(into: [UInt64?]()) { $0.append($1) }
            }
            #expect(versions.count == 1000)
            #expect(versions.allSatisfy { $0 == 1 })
            #expect(source.fetchCount == 1)
        }
    }

    @Test func singleFlightForAThousandOnDemandCallers() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(
            configuration: ProviderConfiguration(backgroundRefreshEnabled: false), source: source, clock: ManualClock())
        await withRunning(provider) {
            let tokens = await withTaskGroup(of: String?.self) { group in
                for _ in 0..<1000 {
                    group.addTask {
                        guard case .onDemand = provider.read() else { return "read should say on demand" }
                        if case .token(let token, _) = await provider.onTokenReady(
                            timeout: .seconds(30), onDemand: true)
                        {
                            return token.token.accessToken
                        }
                        return nil
                    }
                }
                #expect(await eventually { provider.status().waiters == 1000 })
                source.open()
                return await group.reduce(into: [String?]()) { $0.append($1) }
            }
            #expect(Set(tokens) == ["token-1"])
            #expect(source.fetchCount == 1)
        }
    }

    @Test func oneWaitersCancellationLeavesTheOthersServedAndTheFetchRunning() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(configuration: ProviderConfiguration(), source: source, clock: ManualClock())
        await withRunning(provider) {
            let cancelled = Task { await provider.onTokenReady(timeout: .seconds(30)) }
            let patient = Task { await provider.onTokenReady(timeout: .seconds(30)) }
            #expect(await eventually { provider.status().waiters == 2 && source.parkedCount == 1 })
            cancelled.cancel()
            guard case .cancelled = await cancelled.value else {
                Issue.record("the cancelled waiter should end at once, as cancelled")
                return
            }
            #expect(provider.status().waiters == 1)
            source.open()
            guard case .token(let token, _) = await patient.value else {
                Issue.record("the other waiter should get the token")
                return
            }
            #expect(token.version == 1)
            #expect(source.fetchCount == 1)
        }
    }

    @Test func theTimerRefreshesOnTheManualClockAndBacksOffAfterFailures() async {
        let clock = ManualClock()
        let source = ScriptedSource([
            .token(lifetime: .seconds(100)), .failure(.unreachable("down")), .failure(.unreachable("down")),
            .token(lifetime: .seconds(100)),
        ])
        let provider = TokenProvider(
            configuration: ProviderConfiguration(tokenRefreshDelaySec: 300), source: source, clock: clock,
            jitter: .fixed(0.5))
        await withRunning(provider) {
            #expect(await eventually { provider.status().version == 1 })
            // 80 % of 100 s: the refresh-ahead point.
            #expect(await eventually { clock.sleeperCount == 1 })
            clock.advance(by: .seconds(79))
            #expect(source.fetchCount == 1)
            _ = provider.read()
            clock.advance(by: .seconds(1))
            #expect(await eventually { source.fetchCount == 2 && provider.status().consecutiveFailures == 1 })
            #expect(provider.status().stale)
            #expect(await eventually { clock.sleeperCount == 1 })
            clock.advance(by: .milliseconds(100))
            #expect(await eventually { source.fetchCount == 3 && provider.status().consecutiveFailures == 2 })
            #expect(await eventually { clock.sleeperCount == 1 })
            clock.advance(by: .milliseconds(199))
            #expect(source.fetchCount == 3, "the second retry waits 200 ms")
            clock.advance(by: .milliseconds(1))
            #expect(await eventually { provider.status().version == 2 })
            #expect(provider.status().stale == false)
        }
    }

    /// What is left of the issuer's Retry-After, for the 503's own Retry-After: it shrinks as the
    /// clock runs, and is gone once the wait is over.
    @Test func theStatusSaysHowLongTheIssuersRetryAfterStillHoldsFetchesOff() async {
        let clock = ManualClock()
        let slowDown = TokenFetchError.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(600))
        let source = ScriptedSource([.failure(slowDown), .token(lifetime: .seconds(900))])
        let provider = TokenProvider(
            configuration: ProviderConfiguration(maxRetryCount: 0), source: source, clock: clock, jitter: .fixed(0.5))
        await withRunning(provider) {
            #expect(await eventually { provider.status().lastError != nil })
            #expect(provider.status().heldOffFor == .seconds(600))
            clock.advance(by: .seconds(590))
            #expect(provider.status().heldOffFor == .seconds(10))
            #expect(provider.status().lastError?.retryAfter == .seconds(600), "the issuer's own value stays")
            clock.advance(by: .seconds(10))
            #expect(provider.status().heldOffFor == nil)
        }
    }

    /// A request that reached a provider just before it was replaced at a reload, or before the
    /// listeners stopped, still gets its valid token, not a 503 `token_unavailable`; nothing starts.
    @Test func aShutDownProviderStillHandsOutItsValidTokenAndStartsNothing() async {
        let clock = ManualClock()
        let source = ScriptedSource()
        let provider = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: clock, jitter: .fixed(0.5))
        await withRunning(provider) {
            #expect(await eventually { provider.status().version == 1 })
            provider.shutDown()
            guard case .token(let token, stale: false, _) = provider.read() else {
                Issue.record("no token from the shut-down provider: \(provider.read())")
                return
            }
            #expect(token.version == 1 && token.token.accessToken == "token-1")
            guard case .unavailable = provider.read(newerThan: 1) else {
                Issue.record("a newer token than the provider has: \(provider.read(newerThan: 1))")
                return
            }
            clock.advance(by: .seconds(900))
            guard case .unavailable = provider.read() else {
                Issue.record("an expired token was handed out: \(provider.read())")
                return
            }
            #expect(source.fetchCount == 1, "a read after the shutdown starts no fetch")
        }
    }

    @Test func shutdownCompletesEveryWaiter() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(configuration: ProviderConfiguration(), source: source, clock: ManualClock())
        let service = Task { await provider.run() }
        let waiter = Task { await provider.onTokenReady(timeout: .seconds(30)) }
        #expect(await eventually { provider.status().waiters == 1 })
        service.cancel()
        guard case .shuttingDown = await waiter.value else {
            Issue.record("a waiter must hear that the provider stops")
            return
        }
        source.open()
    }
}

/// What a fetch reports (metrics, the log line) is recorded before any waiter hears of its token,
/// so that a client that reads `/metrics` after its answer finds the fetch counted.
@Suite struct FetchReportOrderTests {
    @Test func aFetchIsReportedBeforeItsWaitersAreAnswered() async {
        let reported = Atomic<Int>(0)
        let seenByWaiter = Atomic<Int>(-1)
        let events = ProviderEvents(fetched: { _, _, _ in reported.add(1, ordering: .sequentiallyConsistent) })
        let provider = TokenProvider(
            configuration: ProviderConfiguration(backgroundRefreshEnabled: false), source: ScriptedSource(),
            clock: ManualClock(),
            events: events)
        let service = Task { await provider.run() }
        defer { service.cancel() }
        provider.addWaiter(after: nil, deadline: provider.deadline(in: .seconds(30)), onDemand: true) { _ in
            seenByWaiter.store(reported.load(ordering: .sequentiallyConsistent), ordering: .sequentiallyConsistent)
        }
        #expect(await eventually { seenByWaiter.load(ordering: .sequentiallyConsistent) >= 0 })
        #expect(
            seenByWaiter.load(ordering: .sequentiallyConsistent) == 1,
            "the waiter was answered before the fetch was reported")
    }
}
