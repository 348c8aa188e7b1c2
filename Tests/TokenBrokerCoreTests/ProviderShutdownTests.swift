import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// A provider's `run()` ends only once its fetch has: the broker awaits the providers' tasks
/// before it exits, and a fetch still running then would use OpenSSL after exit tore it down.
struct ProviderShutdownTests {
    @Test func runEndsAfterTheFetchInFlightNotBefore() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: ManualClock(), jitter: .fixed(0.5))
        let order = Lock<[String]>([])
        let service = Task {
            await provider.run()
            order.withLock { $0.append("run ended") }
        }
        #expect(await eventually { source.parkedCount == 1 })
        service.cancel()
        // The fetch (which, like a file read, does not stop when cancelled) ends a moment later.
        let opener = Task {
            try? await Task.sleep(for: .milliseconds(100))
            order.withLock { $0.append("fetch let through") }
            source.open()
        }
        await service.value
        await opener.value
        #expect(order.withLock { $0 } == ["fetch let through", "run ended"])
    }

    /// `shutDown()` is the one way to stop a provider: it answers the waiters at once, on the
    /// caller's thread, and ends `run()` without the task being cancelled.
    @Test func shutDownAnswersWaitersAtOnceAndEndsRun() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: ManualClock(), jitter: .fixed(0.5))
        let ended = Lock(false)
        let service = Task {
            await provider.run()
            ended.withLock { $0 = true }
        }
        let heard = Lock<Provider.WaitOutcome?>(nil)
        provider.addWaiter(after: nil, deadline: provider.deadline(in: .seconds(30))) { outcome in
            heard.withLock { $0 = outcome }
        }
        provider.shutDown()
        guard case .shuttingDown = heard.withLock({ $0 }) else {
            Issue.record("the waiter is answered before shutDown returns")
            return
        }
        // The fetch in flight ends (a gated one only when let through); then run() returns.
        source.open()
        #expect(await eventually { ended.withLock { $0 } }, "run() ends without its task being cancelled")
        service.cancel()
    }

    /// A provider shut down before its task runs ends `run()` as soon as it starts.
    @Test func runEndsAtOnceWhenShutDownCameFirst() async {
        let provider = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: ManualClock())
        provider.shutDown()
        let service = Task { await provider.run() }
        let ended = Lock(false)
        Task {
            await service.value
            ended.withLock { $0 = true }
        }
        #expect(await eventually { ended.withLock { $0 } })
        service.cancel()
    }

    /// A provider replaced at a reload hands its waiters to its replacement, which numbers its
    /// tokens after the old one's: a long-poll for a version newer than the one it has is
    /// answered by the replacement's first token, not by a 503.
    @Test func aReplacedProvidersWaitersAreAnsweredByItsReplacement() async {
        let clock = ManualClock()
        let old = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let oldRun = Task { await old.run() }
        #expect(await eventually { old.status().version == 1 })
        let heard = Lock<[Provider.WaitOutcome]>([])
        for _ in 0..<2 {
            old.addWaiter(after: 1, deadline: old.deadline(in: .seconds(30))) { outcome in
                heard.withLock { $0.append(outcome) }
            }
        }
        // Tokens of its own: the old provider's token again would keep its version, 1.
        let source = ScriptedSource(gated: true, prefix: "replacement-token-")
        let replacement = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: clock, jitter: .fixed(0.5),
            versionsAfter: old.status().version ?? 0)
        let replacementRun = Task { await replacement.run() }
        #expect(await eventually { source.parkedCount == 1 })
        old.shutDown(handingWaitersTo: replacement)
        #expect(heard.withLock { $0 }.isEmpty, "the waiters wait on, for the replacement's token")
        #expect(old.status().version == 1, "the old provider keeps its token; it answers no one now")
        source.open()
        #expect(await eventually { heard.withLock { $0.count } == 2 })
        for outcome in heard.withLock({ $0 }) {
            guard case .token(let token, _) = outcome else {
                Issue.record("a handed-over waiter got \(outcome)")
                continue
            }
            #expect(token.version == 2, "numbered after the replaced provider's version 1")
        }
        replacement.shutDown()
        await oldRun.value
        await replacementRun.value
    }

    /// The old provider goes on serving while its replacement waits for its first token, and
    /// may refresh meanwhile: the hand-over numbers the replacement after every version the
    /// old one handed out, so that no two tokens share a version and a waiter is answered.
    @Test func aReplacementIsNumberedAfterEveryVersionTheOldProviderHandedOut() async {
        let clock = ManualClock()
        let old = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let oldRun = Task { await old.run() }
        #expect(await eventually { old.status().version == 1 })
        let source = ScriptedSource(gated: true, prefix: "replacement-token-")
        let replacement = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: clock, jitter: .fixed(0.5),
            versionsAfter: old.highestVersion)
        let replacementRun = Task { await replacement.run() }
        _ = old.forceRefresh(rejected: 1)
        #expect(await eventually { old.status().version == 2 })
        source.open()
        #expect(await eventually { replacement.status().version == 2 }, "made after version 1, so first numbered 2")
        let heard = Lock<[Provider.WaitOutcome]>([])
        old.addWaiter(after: 2, deadline: old.deadline(in: .seconds(30))) { outcome in
            heard.withLock { $0.append(outcome) }
        }
        old.shutDown(handingWaitersTo: replacement)
        #expect(replacement.status().version == 3, "renumbered after the old provider's version 2")
        guard case .token(let token, _)? = heard.withLock({ $0.first }) else {
            Issue.record("the waiter for a version after 2 was not answered: \(heard.withLock { $0 })")
            return
        }
        #expect(token.version == 3)
        replacement.shutDown()
        await oldRun.value
        await replacementRun.value
    }

    /// A replacement that fetches the token the old provider holds (a token file read again, an
    /// issuer handing out its current token) serves it under the old provider's version: a
    /// handed long-poll for a newer one waits on, and a new token is numbered after it.
    @Test func aReplacementFetchingTheOldProvidersTokenKeepsItsVersion() async {
        let clock = ManualClock()
        let old = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let oldRun = Task { await old.run() }
        #expect(await eventually { old.status().version == 1 })
        let heard = Lock<[Provider.WaitOutcome]>([])
        old.addWaiter(after: 1, deadline: old.deadline(in: .seconds(30))) { outcome in
            heard.withLock { $0.append(outcome) }
        }
        // Its first fetch brings "token-1" again, as the old provider's did; its second, "token-2".
        let source = ScriptedSource()
        let replacement = TokenProvider(
            configuration: ProviderConfiguration(tokenRefreshDelaySec: 10), source: source, clock: clock,
            jitter: .fixed(0.5), versionsAfter: old.highestVersion)
        replacement.numberAfter(old)
        let replacementRun = Task { await replacement.run() }
        #expect(await eventually { replacement.status().version != nil })
        #expect(replacement.status().version == 1, "the old provider's token, under its version")
        old.shutDown(handingWaitersTo: replacement)
        #expect(replacement.status().version == 1)
        #expect(heard.withLock { $0 }.isEmpty, "the long-poll holds version 1: this token is not newer")
        #expect(await eventually { clock.sleeperCount == 1 })
        clock.advance(by: .seconds(10))
        #expect(await eventually { heard.withLock { $0.count } == 1 })
        guard case .token(let token, _)? = heard.withLock({ $0.first }) else {
            Issue.record("the next token answers the long-poll: \(heard.withLock { $0 })")
            return
        }
        #expect(token.version == 2)
        #expect(token.token.accessToken == "token-2")
        replacement.shutDown()
        await oldRun.value
        await replacementRun.value
    }

    /// Two reloads in a row: a waiter handed from the first provider to the second, then to the
    /// third, is still removed through the first provider's id once the second is gone (the
    /// broker keeps none of it): the long-poll's client that hangs up frees its place.
    @Test func aWaiterHandedAlongTwoReloadsIsRemovedThroughItsFirstID() async {
        let clock = ManualClock()
        let first = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let firstRun = Task { await first.run() }
        #expect(await eventually { first.status().version == 1 })
        let heard = Lock(0)
        let id = first.addWaiter(after: 1, deadline: first.deadline(in: .seconds(30))) { _ in
            heard.withLock { $0 += 1 }
        }
        // Neither later provider gets a token meanwhile, so the waiter stays a waiter.
        let thirdSource = ScriptedSource(gated: true)
        let third = TokenProvider(
            configuration: ProviderConfiguration(), source: thirdSource, clock: clock, jitter: .fixed(0.5),
            versionsAfter: first.highestVersion)
        let thirdRun = Task { await third.run() }
        weak var secondLeft: TokenProvider<ManualClock>?
        do {
            let second = TokenProvider(
                configuration: ProviderConfiguration(), source: ScriptedSource([.failure(.unreachable("down"))]),
                clock: clock, jitter: .fixed(0.5), versionsAfter: first.highestVersion)
            secondLeft = second
            let secondRun = Task { await second.run() }
            first.shutDown(handingWaitersTo: second)
            #expect(second.status().waiters == 1)
            second.shutDown(handingWaitersTo: third)
            await secondRun.value
        }
        #expect(third.status().waiters == 1)
        first.removeWaiter(id)
        #expect(third.status().waiters == 0, "removed through the first provider, past the second")
        #expect(secondLeft == nil, "once no handed waiter is left, nothing keeps the second provider")
        #expect(heard.withLock { $0 } == 0)
        thirdSource.open()
        third.shutDown()
        await firstRun.value
        await thirdRun.value
    }

    /// A waiter handed along two reloads and then answered by the third provider is forwarded no
    /// more: nothing keeps the providers in between alive (the broker keeps the first one for
    /// its whole life, and a reload a minute would otherwise keep every provider since).
    @Test func aHandedWaiterAnsweredDownTheChainLetsTheProvidersBetweenGo() async {
        let clock = ManualClock()
        let first = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let firstRun = Task { await first.run() }
        #expect(await eventually { first.status().version == 1 })
        let heard = Lock<[UInt64]>([])
        first.addWaiter(after: 1, deadline: first.deadline(in: .seconds(30))) { outcome in
            if case .token(let token, _) = outcome { heard.withLock { $0.append(token.version) } }
        }
        let thirdSource = ScriptedSource(gated: true, prefix: "third-token-")
        let third = TokenProvider(
            configuration: ProviderConfiguration(), source: thirdSource, clock: clock, jitter: .fixed(0.5),
            versionsAfter: first.highestVersion)
        let thirdRun = Task { await third.run() }
        weak var secondLeft: TokenProvider<ManualClock>?
        do {
            let second = TokenProvider(
                configuration: ProviderConfiguration(), source: ScriptedSource([.failure(.unreachable("down"))]),
                clock: clock, jitter: .fixed(0.5), versionsAfter: first.highestVersion)
            secondLeft = second
            let secondRun = Task { await second.run() }
            first.shutDown(handingWaitersTo: second)
            second.shutDown(handingWaitersTo: third)
            await secondRun.value
        }
        #expect(secondLeft != nil, "kept while its waiter may still be removed through the first provider")
        thirdSource.open()
        #expect(await eventually { heard.withLock { $0 } == [2] })
        #expect(secondLeft == nil, "answered: nothing forwards through the second provider any more")
        third.shutDown()
        await firstRun.value
        await thirdRun.value
    }

    /// A handed waiter's caller that goes away removes it through the old provider's id, as
    /// the routes know it: from the replacement, without an answer; a cancelled wait ends at once.
    @Test func aHandedWaiterIsRemovedAndCancelledThroughItsOldID() async {
        let clock = ManualClock()
        let old = TokenProvider(
            configuration: ProviderConfiguration(), source: ScriptedSource(), clock: clock, jitter: .fixed(0.5))
        let oldRun = Task { await old.run() }
        #expect(await eventually { old.status().version == 1 })
        let heard = Lock(0)
        let id = old.addWaiter(after: 1, deadline: old.deadline(in: .seconds(30))) { _ in heard.withLock { $0 += 1 } }
        let asyncWait = Task { await old.onTokenReady(after: 1, timeout: .seconds(30)) }
        #expect(await eventually { old.status().waiters == 2 })
        let source = ScriptedSource(gated: true, prefix: "replacement-token-")
        let replacement = TokenProvider(
            configuration: ProviderConfiguration(), source: source, clock: clock, jitter: .fixed(0.5),
            versionsAfter: old.highestVersion)
        let replacementRun = Task { await replacement.run() }
        old.shutDown(handingWaitersTo: replacement)
        #expect(replacement.status().waiters == 2)
        old.removeWaiter(id)
        #expect(replacement.status().waiters == 1)
        asyncWait.cancel()
        guard case .cancelled = await asyncWait.value else {
            Issue.record("the cancelled wait did not end as cancelled")
            return
        }
        #expect(replacement.status().waiters == 0)
        source.open()
        #expect(await eventually { replacement.status().version == 2 })
        #expect(heard.withLock { $0 } == 0, "a removed waiter is never answered")
        replacement.shutDown()
        await oldRun.value
        await replacementRun.value
    }

    typealias Provider = TokenProvider<ManualClock>
}

/// A source that counts the fetches that reached it and those that ended, and takes a few
/// scheduler turns over each, as a real fetch takes a while.
private final class CountingSource: TokenSource {
    private let counts = Lock((started: 0, ended: 0))

    var started: Int { counts.withLock { $0.started } }
    var ended: Int { counts.withLock { $0.ended } }

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        let number = counts.withLock { counts -> Int in
            counts.started += 1
            return counts.started
        }
        for _ in 0..<5 { await Task.yield() }
        counts.withLock { $0.ended += 1 }
        return FetchedToken(accessToken: "token-\(number)", lifetime: .seconds(900))
    }
}

extension ProviderShutdownTests {
    /// Fetches start from callers' threads (each on-demand waiter asks for one) while the
    /// provider shuts down, many times over. The provider starts a fetch's task after its lock:
    /// however a shutdown falls between the two, when `run()` ends no fetch is at the source, and
    /// none reaches it afterwards.
    @Test func noFetchIsAtTheSourceAfterRunEndsWhileCallersStartFetches() async {
        for _ in 0..<20 {
            let source = CountingSource()
            let provider = TokenProvider(
                configuration: ProviderConfiguration(backgroundRefreshEnabled: false), source: source,
                clock: ManualClock())
            let service = Task { await provider.run() }
            let callers = Task {
                await withTaskGroup(of: Void.self) { group in
                    for _ in 0..<8 {
                        group.addTask {
                            for _ in 0..<1000 {
                                if case .shuttingDown = await provider.onTokenReady(
                                    timeout: .seconds(30), onDemand: true)
                                {
                                    return
                                }
                            }
                        }
                    }
                }
            }
            #expect(await eventually { source.ended >= 3 })
            service.cancel()
            await service.value
            let started = source.started
            #expect(started == source.ended, "run() ended while a fetch was at the source")
            await callers.value
            for _ in 0..<20 { await Task.yield() }
            #expect(source.started == started, "a fetch reached the source after run() ended")
        }
    }
}
