// A provider template's children on a manual clock: made once per combination of values under
// concurrent first requests, refused past maxChildren, dropped once idle (and only then), kept
// while held or waited on, and all stopped by shutDown.
import Synchronization
import Testing
import TokenBrokerTestSupport

@testable import TokenBrokerCore

/// A template over real providers on a manual clock, counting what it reports.
private final class TemplateFixture: Sendable {
    typealias Child = TokenProvider<ManualClock>
    typealias Template = ProviderTemplate<Child, Int, ManualClock>

    let clock = ManualClock()
    let source: ScriptedSource
    let template: Template
    /// Children made so far (a racing first request may make one that is never used).
    let made = Lock(0)
    let events = Lock<[String]>([])

    init(
        maxChildren: Int = 100, childIdleSec: Int = 60, fetchTimeoutSec: Int? = nil, forcedRefreshWindowSec: Int = 30,
        source: ScriptedSource = ScriptedSource(), versionsAfter: UInt64 = 0
    ) {
        var configuration = ProviderConfiguration(name: "orders", fetchTimeoutSec: fetchTimeoutSec)
        configuration.forcedRefreshWindowSec = forcedRefreshWindowSec
        configuration.perRequest = [.audience, .scope]
        configuration.allowedAudiences = [AllowPattern("https://*")!]
        configuration.allowedScopes = [AllowPattern("read")!, AllowPattern("write")!]
        configuration.maxChildren = maxChildren
        configuration.childIdleSec = childIdleSec
        self.source = source
        let settings = configuration
        let clock = clock
        let made = made
        let events = events
        template = Template(
            configuration: settings, clock: clock,
            makeChild: { _, versionsAfter in
                made.withLock { $0 += 1 }
                return Child(
                    configuration: settings, source: source, clock: clock, jitter: .fixed(0.5),
                    versionsAfter: versionsAfter)
            },
            attach: { _ in made.withLock { $0 } },
            events: TemplateEvents(
                made: { name, values in events.withLock { $0.append("made \(name) \(values)") } },
                dropped: { name, values in events.withLock { $0.append("dropped \(name) \(values)") } },
                ended: { name, values in events.withLock { $0.append("ended \(name) \(values)") } },
                refused: { name, values in events.withLock { $0.append("refused \(name) \(values)") } }),
            versionsAfter: versionsAfter)
    }

    /// The child for the audience `https://<name>`, which must be given.
    func child(_ name: String) -> Child? {
        try? template.child(for: TokenRequestValues(audience: "https://\(name)")).get().held.child
    }

    var children: Int { template.status().children }
}

@Suite struct ProviderTemplateTests {
    private func audience(_ name: String) -> TokenRequestValues { TokenRequestValues(audience: "https://\(name)") }

    @Test func concurrentFirstRequestsForTheSameValuesShareOneChildAndOneFetch() async {
        let fixture = TemplateFixture(source: ScriptedSource(gated: true))
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        let outcomes = await withTaskGroup(of: (ObjectIdentifier?, UInt64?).self) { group in
            for _ in 0..<200 {
                group.addTask {
                    guard let child = fixture.child("orders.example") else { return (nil, nil) }
                    guard case .token(let token, _) = await child.onTokenReady(timeout: .seconds(60)) else {
                        return (ObjectIdentifier(child), nil)
                    }
                    return (ObjectIdentifier(child), token.version)
                }
            }
            #expect(await eventually { fixture.template.status().waiters == 200 })
            fixture.source.open()
            return await group.reduce(into: [(ObjectIdentifier?, UInt64?)]()) { $0.append($1) }
        }
        #expect(outcomes.count == 200)
        #expect(Set(outcomes.map(\.0)).count == 1 && outcomes[0].0 != nil, "one child for every request")
        #expect(outcomes.allSatisfy { $0.1 == 1 }, "every request gets the first token")
        #expect(fixture.source.fetchCount == 1)
        #expect(fixture.children == 1)
        #expect(fixture.events.withLock { $0 } == [#"made orders audience="https://orders.example""#])
    }

    @Test func scopeSetsInAnyOrderAreOneChildAndOtherValuesAnother() throws {
        let fixture = TemplateFixture()
        let configuration = fixture.template.configuration
        func checked(_ scope: String, audience: String? = nil) throws -> TokenRequestValues {
            try TokenRequestValues.checked(audience: audience, scope: scope, resource: nil, for: configuration).get()
        }
        let first = try fixture.template.child(for: checked("read write")).get().held.child
        let second = try fixture.template.child(for: checked("write read")).get().held.child
        let repeated = try fixture.template.child(for: checked("write read write")).get().held.child
        #expect(first === second && first === repeated)
        let other = try fixture.template.child(for: checked("read")).get().held.child
        let withAudience = try fixture.template.child(for: checked("read", audience: "https://a")).get().held.child
        #expect(other !== first && withAudience !== other)
        #expect(fixture.children == 3)
        fixture.template.shutDown()
    }

    @Test func pastMaxChildrenANewChildIsRefusedWithTheTimeTheEarliestCouldBeDropped() {
        let fixture = TemplateFixture(maxChildren: 2, childIdleSec: 60)
        #expect(fixture.child("a") != nil)
        fixture.clock.advance(by: .seconds(10))
        #expect(fixture.child("b") != nil)
        fixture.clock.advance(by: .seconds(5))
        // "a" was read at 0, so it could go at 60: 45 s from now.
        #expect(
            fixture.template.child(for: audience("c")).map { _ in () }
                == .failure(
                    .full(limit: 2, retryAfter: .seconds(45))))
        // Known values are still served, and reading "a" moves the earliest drop to "b"'s, at 70.
        #expect(fixture.child("a") != nil)
        #expect(
            fixture.template.child(for: audience("c")).map { _ in () }
                == .failure(
                    .full(limit: 2, retryAfter: .seconds(55))))
        #expect(fixture.children == 2)
        #expect(fixture.events.withLock { $0.filter { $0.hasPrefix("refused") }.count } == 2)
        #expect(fixture.made.withLock { $0 } == 2, "nothing is made for a refused request")
        fixture.template.shutDown()
    }

    @Test func whenEveryChildIsHeldTheRefusalSaysChildIdleSecAndAtLeastOneSecond() {
        let fixture = TemplateFixture(maxChildren: 1, childIdleSec: 60)
        #expect((try? fixture.template.hold(audience("a")).get()) != nil)
        #expect(
            fixture.template.child(for: audience("b")).map { _ in () }
                == .failure(
                    .full(limit: 1, retryAfter: .seconds(60))))
        fixture.template.release(audience("a"))
        fixture.clock.advance(by: .seconds(60))
        // Due now, not yet swept: a retry in at least one second, never zero.
        #expect(
            fixture.template.child(for: audience("b")).map { _ in () }
                == .failure(
                    .full(limit: 1, retryAfter: .seconds(1))))
        fixture.template.shutDown()
    }

    @Test func anIdleChildIsDroppedAtExactlyChildIdleSecAndAReadPostponesIt() async {
        let fixture = TemplateFixture(childIdleSec: 60)
        guard let first = fixture.child("a") else {
            Issue.record("no child")
            return
        }
        #expect(fixture.child("b") != nil)
        fixture.clock.advance(by: .seconds(30))
        #expect(fixture.child("b") === fixture.child("b"))  // "b" read at 30
        fixture.clock.advance(by: .seconds(29))
        fixture.template.sweep()
        #expect(fixture.children == 2, "not before childIdleSec")
        fixture.clock.advance(by: .seconds(1))
        fixture.template.sweep()
        #expect(fixture.children == 1, "\"a\" at exactly childIdleSec")
        // The dropped child is shut down: a wait on it ends at once.
        guard case .shuttingDown = await first.onTokenReady(timeout: .seconds(5)) else {
            Issue.record("the dropped child still runs")
            return
        }
        fixture.clock.advance(by: .seconds(29))
        fixture.template.sweep()
        #expect(fixture.children == 1, "\"b\" was read at 30")
        fixture.clock.advance(by: .seconds(1))
        fixture.template.sweep()
        #expect(fixture.children == 0)
        #expect(
            fixture.events.withLock { $0.filter { $0.hasPrefix("dropped") } } == [
                #"dropped orders audience="https://a""#, #"dropped orders audience="https://b""#,
            ])
        // A dropped child's values make a new child when asked for again.
        #expect(fixture.child("a") !== first && fixture.children == 1)
        fixture.template.shutDown()
    }

    /// A child made again after its values' child was dropped goes on after the versions the
    /// dropped children handed out, not from 1: a client holding version N of the dropped child
    /// is answered by the new child's token as a newer one, and its refusal of N is an old one.
    @Test func aChildMadeAgainAfterADropNumbersItsTokensAfterTheDroppedChildren() async {
        let fixture = TemplateFixture(childIdleSec: 60)
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        func version(_ name: String) async -> UInt64? {
            guard let child = fixture.child(name),
                case .token(let token, _) = await child.onTokenReady(timeout: .seconds(5))
            else { return nil }
            return token.version
        }
        #expect(await version("a") == 1)
        guard let first = fixture.child("a") else { return }
        _ = first.forceRefresh(rejected: 1)
        #expect(await eventually { first.status().version == 2 })
        #expect(await version("b") == 1)
        fixture.clock.advance(by: .seconds(60))
        #expect(await eventually { fixture.children == 0 })

        #expect(await version("a") == 3, "after the dropped child's version 2")
        #expect(await version("b") == 3, "one number for the template: after every dropped child's")
        guard let again = fixture.child("a"), case .current(let current) = again.forceRefresh(rejected: 2) else {
            Issue.record("version 2 is the dropped child's: the new child's token is newer")
            return
        }
        #expect(current.version == 3)
        #expect(fixture.source.fetchCount == 5, "a refusal of the dropped child's version fetches nothing")

        // Dropped again, the counter goes on from the highest.
        fixture.clock.advance(by: .seconds(60))
        #expect(await eventually { fixture.children == 0 })
        #expect(await version("b") == 4)
    }

    /// The children count their forced refreshes in the template's one window (5 per 30 s):
    /// callers refusing twenty children's tokens six times each make five forced fetches, not
    /// one hundred (each child had a window of its own). One child takes at most three places
    /// while the others take none, so that the others' first refreshes find room.
    @Test func theChildrenShareTheTemplatesWindowOfForcedRefreshes() async {
        let fixture = TemplateFixture()
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        var admitted: [Int] = []
        for index in 0..<20 {
            guard let child = fixture.child("svc.example/\(index)"),
                case .token = await child.onTokenReady(timeout: .seconds(5))
            else {
                Issue.record("child \(index) should have its first token")
                return
            }
            var refreshed = 0
            for _ in 0..<6 {
                switch child.forceRefresh(rejected: nil) {
                case .refreshing(let after):
                    refreshed += 1
                    guard case .token = await child.onTokenReady(after: after, timeout: .seconds(5), forRefresh: true)
                    else {
                        Issue.record("the forced refresh of child \(index) should bring a token")
                        return
                    }
                case .excessive(let retryAfter):
                    #expect(retryAfter == .seconds(30), "no time passes on the manual clock")
                case .current:
                    Issue.record("a refusal of whatever is current refreshes")
                }
            }
            admitted.append(refreshed)
        }
        #expect(admitted == [3, 1, 1] + Array(repeating: 0, count: 17))
        #expect(fixture.source.fetchCount == 20 + 5, "twenty first fetches, and five forced for the template")
        fixture.clock.advance(by: .seconds(30))
        guard let last = fixture.child("svc.example/19"), case .refreshing = last.forceRefresh(rejected: nil) else {
            Issue.record("the window has moved on")
            return
        }
    }

    /// A child dropped and made again for the same values finds the places the dropped one took
    /// in the template's window: dropping a child, which any caller can make happen by waiting
    /// `childIdleSec`, does not give its values a new window.
    @Test func aChildMadeAgainFindsThePlacesItsDroppedPredecessorTook() async {
        let fixture = TemplateFixture(childIdleSec: 60, forcedRefreshWindowSec: 300)
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        guard let first = fixture.child("a"), case .token = await first.onTokenReady(timeout: .seconds(5)) else {
            Issue.record("the child should have its first token")
            return
        }
        for _ in 0..<3 {
            guard case .refreshing(let after) = first.forceRefresh(rejected: nil) else {
                Issue.record("a child takes three places of five")
                return
            }
            _ = await first.onTokenReady(after: after, timeout: .seconds(5), forRefresh: true)
        }
        fixture.clock.advance(by: .seconds(60))
        #expect(await eventually { fixture.children == 0 })
        guard let again = fixture.child("a"), again !== first,
            case .token = await again.onTokenReady(timeout: .seconds(5))
        else {
            Issue.record("the child made again should have its first token")
            return
        }
        guard case .excessive(let retryAfter) = again.forceRefresh(rejected: nil) else {
            Issue.record("the child made again should find its predecessor's three places taken")
            return
        }
        #expect(retryAfter == .seconds(240), "the places taken at 0 s leave the window at 300 s")
        guard let other = fixture.child("b"), case .token = await other.onTokenReady(timeout: .seconds(5)),
            case .refreshing = other.forceRefresh(rejected: nil)
        else {
            Issue.record("another child's first forced refresh finds room")
            return
        }
    }

    /// A template that replaces another at a reload starts its children after the versions the
    /// other's children handed out (`highestVersion`), and after any it is told of before it
    /// serves (`numberAfter`); children already made keep their numbers.
    @Test func aReplacementTemplatesChildrenGoOnAfterTheReplacedTemplatesVersions() async {
        let old = TemplateFixture()
        let oldService = Task { await old.template.run() }
        defer { oldService.cancel() }
        guard let oldChild = old.child("a") else { return }
        _ = await oldChild.onTokenReady(timeout: .seconds(5))
        _ = oldChild.forceRefresh(rejected: 1)
        #expect(await eventually { oldChild.status().version == 2 })
        #expect(old.template.highestVersion == 2, "the highest of its children's")

        let replacement = TemplateFixture(versionsAfter: old.template.highestVersion)
        let service = Task { await replacement.template.run() }
        defer { service.cancel() }
        func version(_ name: String) async -> UInt64? {
            guard let child = replacement.child(name),
                case .token(let token, _) = await child.onTokenReady(timeout: .seconds(5))
            else { return nil }
            return token.version
        }
        #expect(await version("a") == 3)
        // A child made before the swap (a token file's) while the old template's children
        // could still hand out versions up to 7: it goes on after them too, else its token and
        // another one could share a version.
        replacement.template.numberAfter(7)
        #expect(await version("a") == 8, "a child already made goes on after it too")
        #expect(await version("b") == 8)
        #expect(replacement.template.highestVersion == 8)
    }

    @Test func aRenewedLeaseIsAReadAndADroppedOrShutDownChildsLeaseIsRefused() throws {
        let fixture = TemplateFixture(childIdleSec: 60)
        let (lease, first) = try fixture.template.child(for: audience("a")).get()
        fixture.clock.advance(by: .seconds(30))
        #expect(fixture.template.renew(lease)?.child === first.child)
        fixture.clock.advance(by: .seconds(59))
        fixture.template.sweep()
        #expect(fixture.children == 1, "renewed at 30")
        fixture.clock.advance(by: .seconds(1))
        fixture.template.sweep()
        #expect(fixture.children == 0)
        #expect(fixture.template.renew(lease) == nil, "the dropped child's lease ended with it")
        let replacement = try fixture.template.child(for: audience("a")).get()
        #expect(replacement.held.child !== first.child && fixture.children == 1)
        #expect(fixture.template.renew(replacement.lease)?.child === replacement.held.child)
        fixture.template.shutDown()
        #expect(fixture.template.renew(replacement.lease) == nil, "every lease ends with the template")
    }

    @Test func aLeaseEndsOnlyOnceIdleAndOnceEndedIsNeverRenewed() {
        let clock = ManualClock()
        let lease = ChildLease(child: 1, attachment: 2, readAt: clock.now)
        clock.advance(by: .seconds(59))
        #expect(!lease.endIfIdle(for: .seconds(60), at: clock.now))
        #expect(lease.renew(at: clock.now)?.child == 1)
        // A renewal that read the clock before another did never moves the read time back.
        #expect(lease.renew(at: clock.now.advanced(by: .seconds(-30)))?.attachment == 2)
        // Read at 59: idle for 60 at 119, not before.
        clock.advance(by: .seconds(59))
        #expect(!lease.endIfIdle(for: .seconds(60), at: clock.now))
        clock.advance(by: .seconds(1))
        #expect(lease.endIfIdle(for: .seconds(60), at: clock.now))
        #expect(lease.renew(at: clock.now) == nil)
        #expect(!lease.endIfIdle(for: .seconds(60), at: clock.now), "ended once")
    }

    @Test func aReadBetweenTheSweepsTwoStepsKeepsTheChild() throws {
        // The sweep picks the children due, asks each for its waiters with the lock released, then
        // drops those still idle. A child that is read in between, here from inside its own
        // `status()`, which the sweep calls between the two steps, must stay.
        let clock = ManualClock()
        let renewal = Lock<(@Sendable () -> Bool)?>(nil)
        let renewed = Lock<Bool?>(nil)
        let template = ProviderTemplate<StatusHookChild, Int, ManualClock>(
            configuration: TemplateFixture().template.configuration, clock: clock,
            makeChild: { _, _ in
                StatusHookChild {
                    let renew = renewal.withLock { $0 }
                    if let renew { renewed.withLock { $0 = renew() } }
                }
            },
            attach: { _ in 0 })
        let lease = try template.child(for: audience("a")).get().lease
        renewal.withLock { $0 = { template.renew(lease) != nil } }
        clock.advance(by: .seconds(3600))
        template.sweep()
        #expect(renewed.withLock { $0 } == true)
        #expect(template.status().children == 1, "read between the steps")
        renewal.withLock { $0 = nil }
        clock.advance(by: .seconds(3600))
        template.sweep()
        #expect(template.status().children == 0)
        #expect(template.renew(lease) == nil)
        template.shutDown()
    }

    @Test func aRenewalRacingTheSweepIsEitherSeenByItOrRefused() async throws {
        // Each round: a child due to be dropped, renewed on one thread while another sweeps. A
        // renewal that succeeds must keep the child; one that comes after the drop must fail.
        for round in 0..<200 {
            let fixture = TemplateFixture(childIdleSec: 60)
            let lease = try fixture.template.child(for: audience("r\(round)")).get().lease
            fixture.clock.advance(by: .seconds(60))
            async let swept: Void = Task.detached { fixture.template.sweep() }.value
            async let renewed = Task.detached { fixture.template.renew(lease) != nil }.value
            _ = await swept
            let wasRenewed = await renewed
            #expect(wasRenewed == (fixture.children == 1), "round \(round)")
            fixture.template.shutDown()
        }
    }

    @Test func theTemplatesTimerDropsIdleChildrenOnItsOwn() async {
        let fixture = TemplateFixture(childIdleSec: 60)
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        #expect(fixture.child("a") != nil)
        fixture.clock.advance(by: .seconds(59))
        try? await Task.sleep(for: .milliseconds(50))
        #expect(fixture.children == 1)
        fixture.clock.advance(by: .seconds(1))
        #expect(await eventually { fixture.children == 0 })
        // And again for a child made later, with the timer re-armed.
        #expect(fixture.child("b") != nil)
        fixture.clock.advance(by: .seconds(60))
        #expect(await eventually { fixture.children == 0 })
    }

    @Test func aHeldChildIsNeverDroppedUntilReleased() {
        let fixture = TemplateFixture(childIdleSec: 60)
        let held = try? fixture.template.hold(audience("a")).get()
        #expect(held != nil)
        // A read finds the held child.
        #expect(fixture.child("a") === held)
        fixture.clock.advance(by: .seconds(86_400))
        fixture.template.sweep()
        #expect(fixture.children == 1)
        #expect(fixture.template.status().held.count == 1)
        fixture.template.release(audience("a"))
        fixture.clock.advance(by: .seconds(59))
        fixture.template.sweep()
        #expect(fixture.children == 1, "idle time starts at the release")
        fixture.clock.advance(by: .seconds(1))
        fixture.template.sweep()
        #expect(fixture.children == 0)
        fixture.template.shutDown()
    }

    @Test func aChildWithAWaiterIsNotDroppedAndItsIdleTimeStartsAgain() async {
        let fixture = TemplateFixture(childIdleSec: 60, fetchTimeoutSec: 600, source: ScriptedSource(gated: true))
        guard let child = fixture.child("a") else {
            Issue.record("no child")
            return
        }
        let waiter = Task { await child.onTokenReady(timeout: .seconds(500)) }
        #expect(await eventually { child.status().waiters == 1 })
        fixture.clock.advance(by: .seconds(60))
        fixture.template.sweep()
        #expect(fixture.children == 1, "a long-poll in progress is a read")
        fixture.source.open()
        guard case .token = await waiter.value else {
            Issue.record("the waiter got no token")
            return
        }
        fixture.clock.advance(by: .seconds(59))
        fixture.template.sweep()
        #expect(fixture.children == 1, "idle from the sweep that found the waiter")
        fixture.clock.advance(by: .seconds(1))
        fixture.template.sweep()
        #expect(fixture.children == 0)
        fixture.template.shutDown()
    }

    /// `ended` comes once a dropped child's `run()` has returned, its fetch with it (so that no
    /// save of that fetch can follow the store's `forget`); a child shut down with its template
    /// is not dropped, and is not reported.
    @Test func aDroppedChildIsReportedEndedOnceItsFetchHasEnded() async {
        let fixture = TemplateFixture(childIdleSec: 60, source: ScriptedSource(gated: true))
        let service = Task { await fixture.template.run() }
        #expect(fixture.child("a") != nil)
        #expect(await eventually { fixture.source.parkedCount == 1 }, "its first fetch waits at the gate")
        fixture.clock.advance(by: .seconds(60))
        fixture.template.sweep()
        #expect(fixture.children == 0)
        let ended = { fixture.events.withLock { $0.filter { $0.hasPrefix("ended") } } }
        // The fetch is parked at the gate, so run() has not returned: a moment's wait shows no `ended`.
        try? await Task.sleep(for: .milliseconds(100))
        #expect(ended().isEmpty, "reported while its fetch still runs")
        fixture.source.open()
        #expect(await eventually { ended() == [#"ended orders audience="https://a""#] })
        #expect(fixture.child("b") != nil)
        fixture.template.shutDown()
        await service.value
        #expect(ended() == [#"ended orders audience="https://a""#], "a child shut down with its template is not")
    }

    /// A child made again for the same values before the dropped one has ended may rely on its
    /// record: the dropped one's end is not reported.
    @Test func aDroppedChildWhoseValuesHaveANewChildIsNotReportedEnded() async {
        let fixture = TemplateFixture(childIdleSec: 60, source: ScriptedSource(gated: true))
        let service = Task { await fixture.template.run() }
        let first = fixture.child("a")
        #expect(await eventually { fixture.source.parkedCount == 1 })
        fixture.clock.advance(by: .seconds(60))
        fixture.template.sweep()
        let again = fixture.child("a")
        #expect(first != nil && again != nil && first !== again)
        fixture.source.open()
        guard case .token = await again?.onTokenReady(timeout: .seconds(20)) else {
            Issue.record("the new child got no token")
            return
        }
        // The dropped child's fetch ended with the new one's: a moment for its run() to return.
        try? await Task.sleep(for: .milliseconds(200))
        fixture.template.shutDown()
        await service.value
        #expect(fixture.events.withLock { $0.filter { $0.hasPrefix("ended") } }.isEmpty)
    }

    @Test func shutDownEndsRunAndEveryChildAndRefusesLaterRequests() async {
        let fixture = TemplateFixture(source: ScriptedSource(gated: true))
        let ended = Mutex(false)
        let service = Task {
            await fixture.template.run()
            ended.withLock { $0 = true }
        }
        let children = ["a", "b", "c"].compactMap { fixture.child($0) }
        #expect(children.count == 3)
        let waiter = Task { await children[1].onTokenReady(timeout: .seconds(500)) }
        #expect(await eventually { children[1].status().waiters == 1 })
        fixture.template.shutDown()
        guard case .shuttingDown = await waiter.value else {
            Issue.record("the waiter was not answered")
            return
        }
        // Each child's fetch is parked at the gate: run() waits for them to end.
        fixture.source.open()
        #expect(await eventually { ended.withLock { $0 } })
        await service.value
        for child in children {
            guard case .shuttingDown = await child.onTokenReady(timeout: .seconds(5)) else {
                Issue.record("a child still runs")
                continue
            }
        }
        #expect(fixture.template.child(for: audience("a")).map { _ in () } == .failure(.stopped))
        #expect(fixture.template.hold(audience("d")).map { _ in () } == .failure(.stopped))
        #expect(fixture.children == 0)
    }

    @Test func statusCountsChildrenReadyChildrenAndWaiters() async {
        let fixture = TemplateFixture()
        let service = Task { await fixture.template.run() }
        defer { service.cancel() }
        #expect(fixture.child("a") != nil)
        #expect((try? fixture.template.hold(audience("b")).get()) != nil)
        #expect(await eventually { fixture.template.status().ready == 2 })
        let status = fixture.template.status()
        #expect(status.name == "orders" && status.children == 2 && status.maxChildren == 100)
        #expect(status.held.count == 1 && status.heldReady)
    }
}

extension Result where Success == Void, Failure == ChildRefusal {
    fileprivate static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case (.success, .success): true
        case (.failure(let left), .failure(let right)): left == right
        default: false
        }
    }
}

/// A child that does nothing but call `onStatus` whenever its status is asked for.
private final class StatusHookChild: TemplateChild {
    private let onStatus: @Sendable () -> Void

    init(onStatus: @escaping @Sendable () -> Void) { self.onStatus = onStatus }

    func status() -> ProviderStatus {
        onStatus()
        return ProviderStatus(
            name: "hook", phase: .fresh, version: nil, stale: false, expiresIn: nil, lastError: nil,
            consecutiveFailures: 0, waiters: 0, backgroundRefresh: true)
    }

    var highestVersion: UInt64 { 0 }
    func renumber(after version: UInt64) {}
    func run() async {}
    func shutDown() {}
    func shareForcedRefreshes(
        _ window: SharedForcedRefreshWindow<ContinuousClock.Instant>,
        early: SharedForcedRefreshWindow<ContinuousClock.Instant>, as values: TokenRequestValues
    ) {}
}
