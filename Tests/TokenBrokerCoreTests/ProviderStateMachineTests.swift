import Foundation
import Testing
import TokenBrokerCore

/// The WAF SDK's rules, checked step by step at exact instants on a hand-driven machine.
@Suite struct ProviderStateMachineTests {
    @Test func backgroundRefreshFetchesAtStartAndServesTheCacheWithoutWaiting() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        #expect(harness.fetchesStarted == 1)
        #expect(harness.read().token == nil)
        harness.succeed()
        let read = harness.read()
        #expect(read.token?.version == 1)
        #expect(read.stale == false)
        #expect(harness.fetchesStarted == 1, "reading the cache must not fetch")
    }

    /// A template's child can be asked for a token before its task runs `start`: a fetch that
    /// request started, and its result, stand; `start` fetches only when nothing is planned.
    @Test func startAfterARequestsFetchKeepsItsTokenOrItsBackoff() {
        var harness = MachineHarness(ProviderConfiguration())
        _ = harness.wait(after: nil, for: .seconds(30))
        #expect(harness.fetchesStarted == 1)
        harness.start()
        #expect(harness.fetchesStarted == 1, "the fetch in flight is the start's")
        harness.succeed()
        let planned = harness.machine.fetchDueAt
        harness.start()
        #expect(harness.fetchesStarted == 1, "a token just fetched is not fetched again")
        #expect(harness.machine.fetchDueAt == planned && planned != nil)

        var failing = MachineHarness(ProviderConfiguration())
        _ = failing.wait(after: nil, for: .seconds(30))
        failing.fail()
        let retry = failing.machine.fetchDueAt
        failing.start()
        #expect(failing.fetchesStarted == 1, "the backoff stands")
        #expect(failing.machine.fetchDueAt == retry && retry != nil)
    }

    @Test func backoffDoublesFrom100msThenSwitchesToMaxErrorDelay() {
        var harness = MachineHarness(ProviderConfiguration(maxRetryCount: 5, maxErrorTokenRefreshDelayMsec: 5000))
        harness.start()
        var waits: [Duration] = []
        for _ in 0..<8 {
            harness.fail()
            let wait = harness.nextFetchDelay!
            waits.append(wait)
            harness.tick(at: harness.now.offset + wait)
        }
        #expect(waits == [100, 200, 400, 800, 1600, 5000, 5000, 5000].map { Duration.milliseconds($0) })
        #expect(harness.fetchesStarted == 9, "the first fetch and eight retries")
    }

    @Test func onDemandDefaultsToThreeRetries() {
        #expect(ProviderConfiguration(backgroundRefreshEnabled: false).effectiveMaxRetryCount == 3)
        #expect(ProviderConfiguration(backgroundRefreshEnabled: true).effectiveMaxRetryCount == 5)
    }

    @Test func jitterKeepsEachBackoffWithinTwentyPercent() {
        let policy = RetryPolicy(maxRetryCount: 5, slowDelay: .seconds(5))
        for failure in 1...5 {
            let nominal = Duration.milliseconds(100) * Int(1 << (failure - 1))
            let low = policy.delay(afterFailures: failure, unit: 0)
            let high = policy.delay(afterFailures: failure, unit: 0.999_999)
            #expect(low == nominal * 0.8)
            #expect(high > nominal * 1.19 && high <= nominal * 1.2)
        }
    }

    @Test func aLongerRetryAfterFromTheIssuerIsHonoured() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.fail(.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(7)))
        #expect(harness.nextFetchDelay == .seconds(7))
        harness.tick(at: .seconds(7))
        harness.fail(.rateLimited("slow down", httpStatus: 429, retryAfter: .milliseconds(10)))
        #expect(harness.nextFetchDelay == .milliseconds(200), "a shorter Retry-After does not shorten the backoff")
    }

    /// A forced refresh inside the issuer's Retry-After starts no fetch and uses no place in the
    /// refresh window: its caller waits for the retry planned for when the Retry-After ends, or,
    /// when that is past its deadline, gets at once what its deadline would bring.
    @Test func aForcedRefreshInsideTheIssuersRetryAfterWaitsForThePlannedRetry() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300))
        harness.start()
        harness.succeed()
        harness.tick(at: .seconds(300))
        #expect(harness.fetchesStarted == 2)
        harness.fail(.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(600)))
        #expect(harness.machine.notBefore == .init(offset: .seconds(900)))
        for attempt in 1...8 {
            harness.now = .init(offset: .seconds(300 + attempt))
            guard case .refreshing(let after) = harness.forceRefresh(rejected: 1) else {
                Issue.record("forced refresh \(attempt) inside the Retry-After should wait, not be refused")
                return
            }
            #expect(after == 1)
        }
        #expect(harness.fetchesStarted == 2, "the issuer said to wait 600 s")
        #expect(harness.machine.fetchDueAt == .init(offset: .seconds(900)))
        let (early, actions) = harness.machine.addWaiter(
            after: 1, deadline: harness.now.advanced(by: .seconds(30)), forRefresh: true, now: harness.now)
        harness.record(actions)
        guard case .timedOut(let current?, let error)? = harness.outcomes[early] else {
            Issue.record("a forced refresh that cannot fetch before its deadline is answered at once")
            return
        }
        #expect(current.version == 1)
        #expect(error?.retryAfter == .seconds(600))
        harness.now = .init(offset: .seconds(880))
        let (late, lateActions) = harness.machine.addWaiter(
            after: 1, deadline: harness.now.advanced(by: .seconds(30)), forRefresh: true, now: harness.now)
        harness.record(lateActions)
        #expect(harness.outcomes[late] == nil, "the retry at 900 s comes before this deadline")
        harness.runTimers(until: .seconds(900)) { $0.succeed() }
        #expect(harness.fetchTimes.last == .seconds(900))
        guard case .token(let token, _)? = harness.outcomes[late] else {
            Issue.record("the planned retry answers the waiting forced refresh")
            return
        }
        #expect(token.version == 2)
        for attempt in 1...5 {
            harness.now = .init(offset: .seconds(900 + attempt))
            guard case .refreshing = harness.forceRefresh(rejected: UInt64(attempt + 1)) else {
                Issue.record("the forced refreshes held off used no place in the window")
                return
            }
            harness.succeed()
        }
    }

    /// A proxied request whose token was refused waits for the forced refresh only until a fetch
    /// fails (`endsOnFailedFetch`): its refused answer then goes on, with the token still valid
    /// and the fetch's error, not at its deadline. Another forced refresh's waiter (`POST
    /// /token/refresh`) waits on through the retries, and the next fetch's token answers it.
    @Test func aForcedRefreshWaiterThatEndsOnAFailedFetchIsAnsweredByTheFirstFailure() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed()
        guard case .refreshing = harness.forceRefresh(rejected: 1) else {
            Issue.record("a forced refresh of the current token fetches")
            return
        }
        let deadline = harness.now.advanced(by: .seconds(30))
        let (proxied, first) = harness.machine.addWaiter(
            after: 1, deadline: deadline, forRefresh: true, endsOnFailedFetch: true, now: harness.now)
        harness.record(first)
        let (plain, second) = harness.machine.addWaiter(
            after: 1, deadline: deadline, forRefresh: true, now: harness.now)
        harness.record(second)
        harness.fail(.serverError("sick", httpStatus: 500))
        guard case .timedOut(let current?, let error?)? = harness.outcomes[proxied] else {
            Issue.record("the failed fetch answers the waiter that ends on one")
            return
        }
        #expect(current.version == 1)
        #expect(error.httpStatus == 500)
        #expect(harness.outcomes[plain] == nil, "the other waits through the retries")
        harness.runTimers(until: .seconds(29)) { $0.succeed() }
        guard case .token(let token, _)? = harness.outcomes[plain] else {
            Issue.record("the retry's token answers the waiter that waited")
            return
        }
        #expect(token.version == 2)
    }

    /// Past its retries the provider tries again every `maxErrorTokenRefreshDelayMsec`, which can
    /// be longer than the issuer's Retry-After: a forced refresh inside the Retry-After fetches
    /// when that ends, not at the later planned retry (the reviewer's case: Retry-After 2 s, the
    /// next planned retry 20 s on, a forced refresh waiting 8 s got nothing).
    @Test func aForcedRefreshHeldOffByTheIssuerFetchesWhenItsRetryAfterEndsNotAtTheLaterRetry() {
        var harness = MachineHarness(
            ProviderConfiguration(tokenRefreshDelaySec: 300, maxRetryCount: 0, maxErrorTokenRefreshDelayMsec: 20_000))
        harness.start()
        harness.succeed()
        harness.tick(at: .seconds(300))
        harness.fail(.serverError("busy", httpStatus: 503, retryAfter: .seconds(2)))
        #expect(harness.machine.fetchDueAt == .init(offset: .seconds(320)))
        harness.now = .init(offset: .seconds(301))
        guard case .refreshing = harness.forceRefresh(rejected: 1) else {
            Issue.record("a forced refresh inside the Retry-After waits for the fetch")
            return
        }
        #expect(harness.machine.fetchDueAt == .init(offset: .seconds(302)))
        let (waiter, actions) = harness.machine.addWaiter(
            after: 1, deadline: harness.now.advanced(by: .seconds(8)), forRefresh: true, now: harness.now)
        harness.record(actions)
        #expect(harness.outcomes[waiter] == nil)
        harness.runTimers(until: .seconds(303)) { $0.succeed() }
        #expect(harness.fetchTimes.last == .seconds(302))
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the fetch at the end of the Retry-After answers the forced refresh")
            return
        }
        #expect(token.version == 2)
    }

    /// Without background refresh, retries that run out do not forget the issuer's Retry-After:
    /// a request inside it is answered at once as when the retries run out, without a fetch, and
    /// one whose wait reaches past it gets the fetch made when it ends.
    @Test func onDemandRequestsKeepTheIssuersRetryAfterWhenTheRetriesRunOut() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false, maxRetryCount: 0))
        let first = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        harness.fail(.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(3600)))
        guard case .exhausted(nil, _)? = harness.outcomes[first] else {
            Issue.record("with no retries the first request gives up at once")
            return
        }
        for second in 1...8 {
            harness.now = .init(offset: .seconds(second))
            let id = harness.wait(after: nil, for: .seconds(30), onDemand: true)
            guard case .exhausted(nil, let error)? = harness.outcomes[id] else {
                Issue.record("request \(second) inside the Retry-After should be answered at once")
                return
            }
            #expect(error?.retryAfter == .seconds(3600))
        }
        #expect(harness.fetchesStarted == 1, "the issuer said 429 with Retry-After: 3600")
        harness.now = .init(offset: .seconds(3590))
        let patient = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        #expect(harness.fetchesStarted == 1)
        #expect(harness.outcomes[patient] == nil)
        harness.runTimers(until: .seconds(3600)) { $0.succeed() }
        #expect(harness.fetchTimes == [.zero, .seconds(3600)])
        guard case .token(let token, _)? = harness.outcomes[patient] else {
            Issue.record("the fetch made when the Retry-After ends answers the waiting request")
            return
        }
        #expect(token.version == 1)
    }

    /// The request whose own fetch brings the issuer's Retry-After is answered then, when its
    /// wait ends before the Retry-After does, as a request arriving inside it is: it waited its
    /// whole `maxWaitSec` (10 s in the review that found it, against Retry-After: 120) for a
    /// fetch that could not start. One whose wait reaches past the Retry-After keeps waiting,
    /// and a forced refresh is answered the same way, with the current token.
    @Test func aWaiterWhoseWaitEndsInsideTheRetryAfterItsFetchBroughtIsAnsweredThen() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false, maxRetryCount: 3))
        let short = harness.wait(after: nil, for: .seconds(10), onDemand: true)
        let long = harness.wait(after: nil, for: .seconds(200), onDemand: true)
        harness.fail(.serverError("busy", httpStatus: 503, retryAfter: .seconds(120)))
        guard case .exhausted(nil, let error)? = harness.outcomes[short] else {
            Issue.record("the request whose wait ends inside the Retry-After is answered at once")
            return
        }
        #expect(error?.retryAfter == .seconds(120))
        #expect(harness.outcomes[long] == nil)
        harness.runTimers(until: .seconds(121)) { $0.succeed() }
        #expect(harness.fetchTimes == [.zero, .seconds(120)])
        guard case .token(let token, _)? = harness.outcomes[long] else {
            Issue.record("the fetch when the Retry-After ends answers the patient request")
            return
        }
        #expect(token.version == 1)

        var refreshing = MachineHarness(
            ProviderConfiguration(tokenRefreshDelaySec: 300, maxRetryCount: 0, maxErrorTokenRefreshDelayMsec: 20_000))
        refreshing.start()
        refreshing.succeed()
        guard case .refreshing = refreshing.forceRefresh(rejected: 1) else {
            Issue.record("a forced refresh of the current token fetches")
            return
        }
        let (forced, actions) = refreshing.machine.addWaiter(
            after: 1, deadline: refreshing.now.advanced(by: .seconds(8)), forRefresh: true, now: refreshing.now)
        refreshing.record(actions)
        refreshing.fail(.rateLimited("slow down", httpStatus: 429, retryAfter: .seconds(60)))
        guard case .timedOut(let current?, _)? = refreshing.outcomes[forced] else {
            Issue.record("the forced refresh is answered at once with the current token")
            return
        }
        #expect(current.version == 1)
    }

    @Test func backgroundRefreshIsDueAtTokenRefreshDelayForLongLivedTokens() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300))
        harness.start()
        harness.succeed(lifetime: .seconds(3600))
        #expect(harness.nextFetchDelay == .seconds(300))
    }

    @Test func refreshAheadFallsBetween75And85PercentOfAShortLifetime() {
        for (unit, expected) in [(0.0, 45.0), (0.5, 48.0), (0.999_999, 51.0)] {
            var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300), jitter: .fixed(unit))
            harness.start()
            harness.succeed(lifetime: .seconds(60))
            let wait = harness.nextFetchDelay!
            #expect(
                abs(Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18 - expected) < 0.001)
        }
        // A one-second token is renewed before its expiry minus the safety margin.
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300), jitter: .fixed(0.999_999))
        harness.start()
        harness.succeed(lifetime: .seconds(1))
        #expect(harness.nextFetchDelay! <= .milliseconds(900))
    }

    @Test func refreshPausesAfterTokenRefreshDelayWithoutActivityAndResumesOnTheNextRead() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300))
        harness.start()
        harness.succeed(lifetime: .seconds(3600))
        // At 300 s the provider has been idle exactly 300 s, not more: it refreshes.
        harness.tick(at: .seconds(300))
        #expect(harness.fetchesStarted == 2)
        harness.succeed(lifetime: .seconds(3600))
        // At 600 s it has been idle 600 s: it pauses and calls nobody.
        harness.tick(at: .seconds(600))
        #expect(harness.fetchesStarted == 2)
        #expect(harness.machine.isPaused)
        #expect(harness.machine.nextWakeup == nil, "a paused provider plans no fetch at all")
        #expect(harness.machine.phase(at: harness.now) == .paused)
        // Hours later a read comes: the token is still valid, so it is served, and refresh resumes at once.
        harness.now = .init(offset: .seconds(3000))
        let read = harness.read()
        #expect(read.token?.version == 2)
        #expect(harness.fetchesStarted == 3)
        #expect(!harness.machine.isPaused)
    }

    @Test func aReadAfterThePausedTokenExpiredGetsNothingButStartsAFetch() {
        var harness = MachineHarness.pausedWithAnExpiredToken()
        #expect(harness.read().token == nil, "an expired token is never served")
        #expect(harness.fetchesStarted == 3)
    }

    @Test func onTokenReadyAfterAPauseWithAValidTokenCompletesAtOnce() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 10))
        harness.start()
        harness.succeed(lifetime: .seconds(1000))
        harness.runTimers(until: .seconds(100)) { $0.succeed(lifetime: .seconds(1000)) }
        #expect(harness.machine.isPaused)
        let id = harness.wait(after: nil, for: .seconds(30))
        guard case .token(let token, _)? = harness.outcomes[id] else {
            Issue.record("expected the cached token at once")
            return
        }
        #expect(token.version == harness.machine.cached?.version)
    }

    @Test func onDemandGetTokenFetchesEveryTimeAndFallsBackToThePreviousValidToken() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false))
        harness.start()
        #expect(harness.fetchesStarted == 0, "no background refresh: nothing at start")
        let first = harness.wait(after: nil, for: .seconds(60), onDemand: true)
        #expect(harness.fetchesStarted == 1)
        harness.succeed(lifetime: .seconds(900))
        guard case .token(let token, _)? = harness.outcomes[first] else {
            Issue.record("first call should get a token")
            return
        }
        #expect(token.version == 1)
        // A second call wants a new token even though the first is still valid.
        let second = harness.wait(after: nil, for: .seconds(60), onDemand: true)
        #expect(harness.fetchesStarted == 2)
        // The fetch and its three retries fail: the call ends with the previous token.
        harness.fail()
        harness.runTimers(until: .seconds(10)) { $0.fail() }
        #expect(harness.fetchesStarted == 5, "one fetch and maxRetryCount (3) retries")
        guard case .exhausted(let previous, _)? = harness.outcomes[second] else {
            Issue.record("second call should give up after the retries")
            return
        }
        #expect(previous?.version == 1)
        #expect(harness.machine.nextWakeup == nil, "with nobody waiting, on demand stops retrying")
    }

    @Test func onDemandNeverFallsBackToAnExpiredToken() {
        var harness = MachineHarness(ProviderConfiguration(backgroundRefreshEnabled: false))
        _ = harness.wait(after: nil, for: .seconds(60), onDemand: true)
        harness.succeed(lifetime: .seconds(5))
        harness.now = .init(offset: .seconds(5))
        let late = harness.wait(after: nil, for: .seconds(60), onDemand: true)
        harness.fail()
        harness.runTimers(until: .seconds(20)) { $0.fail() }
        guard case .exhausted(let previous, let error)? = harness.outcomes[late] else {
            Issue.record("expected the retries to run out")
            return
        }
        #expect(previous == nil)
        #expect(error?.description == "server_error")
    }

    @Test func onTokenReadyWithoutBackgroundRefreshKeepsTryingAtTheSlowCadence() {
        var harness = MachineHarness(
            ProviderConfiguration(backgroundRefreshEnabled: false, maxErrorTokenRefreshDelayMsec: 2000))
        let id = harness.wait(after: nil, for: .seconds(60))
        harness.fail()
        harness.runTimers(until: .seconds(11)) { $0.fail() }
        // 100, 200, 400 ms of backoff, then every 2 s: fetches at 0, .1, .3, .7, 2.7, 4.7, 6.7, 8.7, 10.7.
        #expect(
            harness.fetchTimes == [0, 100, 300, 700, 2700, 4700, 6700, 8700, 10700].map { Duration.milliseconds($0) })
        #expect(harness.outcomes[id] == nil, "onTokenReady keeps waiting")
        harness.runTimers(until: .seconds(13)) { $0.succeed() }
        guard case .token? = harness.outcomes[id] else {
            Issue.record("expected the token once the issuer heals")
            return
        }
    }

    @Test func forcedRefreshesAreLimitedToFiveInThirtySeconds() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed()
        for attempt in 1...5 {
            harness.now = .init(offset: .seconds(attempt))
            guard case .refreshing = harness.forceRefresh(rejected: UInt64(attempt)) else {
                Issue.record("attempt \(attempt) should refresh")
                return
            }
            harness.succeed()
        }
        #expect(harness.fetchesStarted == 6)
        harness.now = .init(offset: .seconds(10))
        guard case .excessive(let retryAfter) = harness.forceRefresh(rejected: 6) else {
            Issue.record("the sixth forced refresh in 30 s must be refused")
            return
        }
        #expect(retryAfter == .seconds(21), "the first attempt, at 1 s, leaves the window at 31 s")
        #expect(harness.fetchesStarted == 6, "a refused forced refresh calls nobody")
        harness.now = .init(offset: .seconds(31))
        guard case .refreshing = harness.forceRefresh(rejected: 6) else {
            Issue.record("the window has moved on")
            return
        }
    }

    /// A template's children count their forced refreshes in the template's one window (5 per
    /// 30 s), not each in its own: callers refusing twenty children's tokens six times each make
    /// five forced fetches, not a hundred. One child takes three places (half the window, rounded
    /// up) while the others take none, so two are left for other children's first refreshes.
    @Test func childrenSharingTheTemplatesWindowMakeItsForcedFetchesBetweenThem() {
        let window = SharedForcedRefreshWindow<MachineHarness.Instant>(interval: .seconds(30), maximumAttempts: 5)
        var admitted: [Int] = []
        var children: [MachineHarness] = []
        for index in 0..<20 {
            var child = MachineHarness(ProviderConfiguration())
            child.machine.shareForcedRefreshes(
                window, early: SharedForcedRefreshWindow(interval: .seconds(30), maximumAttempts: 5),
                as: TokenRequestValues(audience: "https://svc.example/\(index)"))
            child.start()
            child.succeed()
            child.now = .init(offset: .seconds(1))
            var refreshed = 0
            for _ in 0..<6 {
                switch child.forceRefresh(rejected: nil) {
                case .refreshing:
                    refreshed += 1
                    child.succeed()
                case .excessive(let retryAfter):
                    #expect(retryAfter == .seconds(30), "the window's first places leave it at 31 s")
                case .current:
                    Issue.record("a refusal of whatever is current refreshes")
                }
            }
            admitted.append(refreshed)
            children.append(child)
        }
        #expect(admitted == [3, 1, 1] + Array(repeating: 0, count: 17))
        #expect(children.map(\.fetchesStarted).reduce(0, +) == 20 + 5, "twenty first fetches and five forced")
        children[19].now = .init(offset: .seconds(31))
        guard case .refreshing = children[19].forceRefresh(rejected: nil) else {
            Issue.record("the window has moved on")
            return
        }
    }

    /// An early refresh (a cloud SDK's margin) is counted in the template's window of early
    /// refreshes, apart from the retrier's: callers forcing refreshes on the template's other
    /// children, and on the child itself, cannot take its places, which left the SDK a token it
    /// treats as expired. That window is the template's, shared as the retrier's is, so that
    /// the SDK routes' callers, who choose which children exist, cannot make the issuer fetch
    /// more per window than five early refreshes, however many children they make.
    @Test func earlyRefreshesHaveTheTemplatesWindowOfTheirOwnWhichTheRetriersCallersCannotFill() {
        let window = SharedForcedRefreshWindow<MachineHarness.Instant>(interval: .seconds(30), maximumAttempts: 5)
        let early = SharedForcedRefreshWindow<MachineHarness.Instant>(interval: .seconds(30), maximumAttempts: 5)
        var children: [MachineHarness] = []
        for index in 0..<4 {
            var child = MachineHarness(ProviderConfiguration())
            child.machine.shareForcedRefreshes(
                window, early: early, as: TokenRequestValues(audience: "https://svc.example/\(index)"))
            child.start()
            child.succeed()
            child.now = .init(offset: .seconds(1))
            children.append(child)
        }
        // One child takes its three places, another a fourth: the retrier's window is shut to it.
        for _ in 0..<3 {
            guard case .refreshing = children[0].forceRefresh(rejected: nil) else {
                Issue.record("the first child's first three forced refreshes are admitted")
                return
            }
            children[0].succeed()
        }
        guard case .refreshing = children[1].forceRefresh(rejected: nil) else {
            Issue.record("the second child's first forced refresh is admitted")
            return
        }
        children[1].succeed()
        guard case .excessive = children[1].forceRefresh(rejected: nil) else {
            Issue.record("the retrier's window is shut to the second child")
            return
        }
        // Early refreshes (of the current version, as the cloud SDK routes ask; nil names it too).
        func earlyRefreshes(_ index: Int, tries: Int = 6) -> Int {
            var admitted = 0
            for _ in 0..<tries {
                guard case .refreshing = children[index].forceRefresh(rejected: nil, early: true) else { break }
                admitted += 1
                children[index].succeed()
            }
            return admitted
        }
        let fetches = children.map(\.fetchesStarted).reduce(0, +)
        #expect(earlyRefreshes(1) == 3, "the child's share of the early window, whatever the retrier's callers took")
        #expect(earlyRefreshes(2) == 1 && earlyRefreshes(3) == 1, "the others' first ones find room")
        #expect(earlyRefreshes(0) == 0, "five per 30 s for the template as a whole")
        #expect(children.map(\.fetchesStarted).reduce(0, +) == fetches + 5)
        children[0].now = .init(offset: .seconds(31))
        guard case .refreshing = children[0].forceRefresh(rejected: nil, early: true) else {
            Issue.record("the early window has moved on")
            return
        }
    }

    /// In a template's window, a child that holds places takes another only while fewer than
    /// half the places are taken, or once its own have left the window: its Retry-After is the
    /// earlier of the two (a plain provider's window has no such share: five of its own).
    @Test func aChildHoldingItsShareWaitsUntilTheWindowHasRoomForIt() {
        var window = ForcedRefreshWindow<MachineHarness.Instant>(
            interval: .seconds(30), maximumAttempts: 5, sharedByChildren: true)
        let first = TokenRequestValues(audience: "https://a")
        let second = TokenRequestValues(audience: "https://b")
        func at(_ seconds: Int) -> MachineHarness.Instant { .init(offset: .seconds(seconds)) }
        for second in 0..<3 { #expect(window.admit(at: at(second), by: first) == nil) }
        #expect(window.admit(at: at(3), by: second) == nil, "another child's first refresh finds room")
        #expect(
            window.admit(at: at(4), by: first) == .seconds(27),
            "three of five taken until the place taken at 1 s leaves, at 31 s (its own last leaves at 32 s)")
        #expect(window.admit(at: at(31), by: first) == nil)
        // Its own places gone, a child takes one even past half, while the window has room.
        var late = ForcedRefreshWindow<MachineHarness.Instant>(
            interval: .seconds(30), maximumAttempts: 5, sharedByChildren: true)
        #expect(late.admit(at: at(0), by: first) == nil)
        for (index, name) in ["b", "c", "d"].enumerated() {
            #expect(late.admit(at: at(20 + index), by: TokenRequestValues(audience: "https://\(name)")) == nil)
        }
        #expect(late.admit(at: at(25), by: first) == .seconds(5), "its place of 0 s leaves at 30 s")
        #expect(late.admit(at: at(30), by: first) == nil)

        var own = ForcedRefreshWindow<MachineHarness.Instant>(interval: .seconds(30), maximumAttempts: 5)
        for second in 0..<5 { #expect(own.admit(at: at(second)) == nil) }
        #expect(own.admit(at: at(5)) == .seconds(25))
    }

    @Test func forcedRefreshOfAnOlderVersionReturnsTheCurrentTokenWithoutFetching() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed()
        harness.tick(at: .seconds(300))
        harness.succeed()
        guard case .current(let token) = harness.forceRefresh(rejected: 1) else {
            Issue.record("version 1 is old: the current token should come back")
            return
        }
        #expect(token.version == 2)
        #expect(harness.fetchesStarted == 2)
    }

    @Test func forcedRefreshOfANewerVersionRefreshesAndNeverHandsBackTheOlderToken() {
        var harness = MachineHarness(ProviderConfiguration())
        harness.start()
        harness.succeed()
        // Another broker of a fleet handed out version 8 after this one's 1 was refused: the
        // token held here is older than the one refused.
        guard case .refreshing(let after) = harness.forceRefresh(rejected: 8) else {
            Issue.record("a version newer than the one held should refresh, not hand back version 1")
            return
        }
        #expect(after == 1)
        #expect(harness.fetchesStarted == 2)
    }

    @Test func aFailingRefreshServesTheCachedTokenStaleButNeverPastItsExpiry() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 300))
        harness.start()
        harness.succeed(lifetime: .seconds(10))
        harness.runTimers(until: .milliseconds(9999)) { $0.fail() }
        let before = harness.read()
        #expect(before.token?.version == 1)
        #expect(before.stale)
        #expect(harness.machine.phase(at: harness.now) != .expired)
        harness.runTimers(until: .seconds(10)) { $0.fail() }
        #expect(harness.read().token == nil)
        #expect(harness.machine.phase(at: harness.now) == .expired || harness.machine.isFetching)
        let id = harness.wait(after: nil, for: .seconds(1))
        harness.runTimers(until: .seconds(12)) { $0.fail() }
        guard case .timedOut(let current, let error)? = harness.outcomes[id] else {
            Issue.record("the waiter should time out")
            return
        }
        #expect(current == nil)
        #expect(error != nil)
    }

    @Test func waitersForANewerVersionWakeOnTheNextRefreshAndTimeOutOtherwise() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        harness.succeed()
        let patient = harness.wait(after: 1, for: .seconds(120))
        let hasty = harness.wait(after: 1, for: .seconds(5))
        #expect(harness.outcomes.isEmpty)
        harness.runTimers(until: .seconds(61)) { $0.succeed() }
        guard case .timedOut(let current, _)? = harness.outcomes[hasty],
            case .token(let token, _)? = harness.outcomes[patient]
        else {
            Issue.record("expected one timeout and one token")
            return
        }
        #expect(current?.version == 1)
        #expect(token.version == 2)
        #expect(harness.fetchesStarted == 2, "waiters never add fetches to the schedule")
    }

    /// A few long-polls wait while thousands come and go (their clients hang up): the deadlines of
    /// the finished ones do not pile up, and those left still time out on their own deadlines, in order.
    @Test func finishedWaitersDeadlinesDoNotPileUpBesideOnesThatWait() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        harness.succeed()
        var patient: [UInt64] = []
        for timeout in [20, 10, 15] {
            patient.append(harness.wait(after: 1, for: .seconds(timeout)))
            for _ in 0..<2000 {
                harness.machine.removeWaiter(harness.wait(after: 1, for: .seconds(25)))
            }
        }
        #expect(harness.machine.waiterCount == 3)
        #expect(harness.machine.deadlinesKept <= 2 * 3 + 64 + 1, "not one per waiter that came and went")
        // Each left times out on its own deadline, in order.
        for (until, expected) in [(11, [patient[1]]), (16, [patient[1], patient[2]]), (21, patient)] {
            harness.runTimers(until: .seconds(until)) { $0.succeed() }
            let timedOut = patient.filter { id in
                if case .timedOut? = harness.outcomes[id] { true } else { false }
            }
            #expect(Set(timedOut) == Set(expected), "at \(until) s")
        }
    }

    /// A version from before this provider (a restart without a store, a provider removed and
    /// added again) is above every version it handed out: it is not one of its versions. Its
    /// waiter waits as for the version held, and its deadline answers it with the token held,
    /// not `.timedOut` (which became a 304 naming version 1, which the client never had, while
    /// its token was from a process whose key was gone). Not at once: a client long-polling two
    /// brokers without a store, each numbering its own versions, was then answered at once by
    /// each in turn, a loop with no wait. A new token before the deadline answers it as any.
    @Test func aWaiterForAVersionFromBeforeThisProviderGetsTheTokenHeldAtItsDeadline() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        harness.succeed()
        let fromBefore = harness.wait(after: 7, for: .seconds(20))
        let current = harness.wait(after: 1, for: .seconds(20))
        #expect(harness.outcomes.isEmpty, "both wait, as for the version held")
        harness.tick(at: .seconds(20))
        guard case .token(let token, stale: false)? = harness.outcomes[fromBefore] else {
            Issue.record("expected the token held at the deadline: \(harness.outcomes)")
            return
        }
        #expect(token.version == 1)
        guard case .timedOut(let held?, _)? = harness.outcomes[current] else {
            Issue.record("expected the current version's waiter to time out: \(harness.outcomes)")
            return
        }
        #expect(held.version == 1)
        #expect(harness.fetchesStarted == 1, "answered without a fetch")
        let again = harness.wait(after: 9, for: .seconds(120))
        harness.runTimers(until: .seconds(61)) { $0.succeed() }
        guard case .token(let next, _)? = harness.outcomes[again] else {
            Issue.record("expected the next token before the deadline: \(harness.outcomes)")
            return
        }
        #expect(next.version == 2)
    }

    /// With no valid token held, a version from before this provider waits for the next token,
    /// whatever its number, rather than for one above the version it names.
    @Test func aWaiterForAVersionFromBeforeThisProviderWithoutATokenGetsTheNextOne() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        let fromBefore = harness.wait(after: 7, for: .seconds(30))
        #expect(harness.outcomes.isEmpty, "no token yet")
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[fromBefore] else {
            Issue.record("expected the first token: \(harness.outcomes)")
            return
        }
        #expect(token.version == 1)

        // Its token expired before the refresh: the next token answers.
        var expired = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        expired.start()
        expired.succeed(lifetime: .seconds(10))
        expired.now = .init(offset: .seconds(11))
        let late = expired.wait(after: 7, for: .seconds(30))
        #expect(expired.outcomes[late] == nil, "no valid token to answer with")
        expired.tick(at: .seconds(11))
        #expect(expired.machine.isFetching)
        expired.succeed()
        guard case .token(let next, _)? = expired.outcomes[late] else {
            Issue.record("expected the next token: \(expired.outcomes)")
            return
        }
        #expect(next.version == 2)
    }

    /// The versions a provider was numbered after (the provider it replaced, a template's
    /// dropped children) are its own for this rule: a waiter holding one of them waits for a
    /// newer token and times out, and only a version above them all gets the token held at its deadline.
    @Test func versionsNumberedAfterAreKnownAndOnlyThoseAboveThemGetTheTokenAtTheirDeadline() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.machine = MachineHarness.Machine(
            configuration: ProviderConfiguration(tokenRefreshDelaySec: 60), now: harness.now, jitter: .fixed(0.5),
            versionsAfter: 5)
        harness.start()
        harness.succeed()
        #expect(harness.read().token?.version == 6)
        let dropped = harness.wait(after: 5, for: .seconds(30))
        guard case .token(let newer, _)? = harness.outcomes[dropped] else {
            Issue.record("version 6 is newer than 5: \(harness.outcomes)")
            return
        }
        #expect(newer.version == 6)
        let current = harness.wait(after: 6, for: .seconds(30))
        let unknown = harness.wait(after: 7, for: .seconds(30))
        #expect(harness.outcomes[current] == nil && harness.outcomes[unknown] == nil, "both wait")
        harness.tick(at: .seconds(30))
        guard case .timedOut? = harness.outcomes[current] else {
            Issue.record("6 is the current version: its deadline times it out: \(harness.outcomes)")
            return
        }
        guard case .token(let held, _)? = harness.outcomes[unknown] else {
            Issue.record("7 is above every version: its deadline answers the token held: \(harness.outcomes)")
            return
        }
        #expect(held.version == 6)
    }

    /// One new token wakes every waiter it satisfies, in one action, and only those: waiters who
    /// already hold it keep waiting for the next one.
    @Test func aNewTokenWakesExactlyTheWaitersItSatisfies() {
        var harness = MachineHarness(ProviderConfiguration(tokenRefreshDelaySec: 60))
        harness.start()
        harness.succeed()
        let wantTwo = (0..<50).map { _ in harness.wait(after: 1, for: .seconds(300)) }
        #expect(harness.outcomes.isEmpty)
        #expect(harness.machine.waiterCount == 50)
        let (decision, actions) = harness.machine.forceRefresh(rejected: 1, now: harness.now)
        harness.record(actions)
        guard case .refreshing = decision else {
            Issue.record("expected a refresh, got \(decision)")
            return
        }
        let woken = harness.machine.fetchSucceeded(
            FetchedToken(accessToken: "two", lifetime: .seconds(900)), now: harness.now,
            wallTime: WallTime(timeIntervalSince1970: 0))
        guard woken.count == 1, case .complete(let ids, .token(let token, stale: false)) = woken[0] else {
            Issue.record("expected one completion for all woken waiters, got \(woken)")
            return
        }
        #expect(token.version == 2)
        #expect(Set(ids) == Set(wantTwo))
        #expect(harness.machine.waiterCount == 0)
        harness.record(woken)
        let wantThree = (0..<30).map { _ in harness.wait(after: 2, for: .seconds(300)) }
        #expect(harness.machine.waiterCount == 30, "they hold version 2 already")
        harness.runTimers(until: .seconds(61)) { $0.succeed() }
        for id in wantThree {
            guard case .token(let later, _)? = harness.outcomes[id] else {
                Issue.record("waiter \(id) was not woken by version 3")
                continue
            }
            #expect(later.version == 3)
        }
        #expect(harness.machine.waiterCount == 0)
    }
}

extension CachedToken: Equatable where Instant: Equatable {
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.version == rhs.version && lhs.issuedAt == rhs.issuedAt }
}
