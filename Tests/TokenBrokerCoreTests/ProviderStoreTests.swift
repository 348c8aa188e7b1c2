import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// The wall-clock time of the harness's and the manual clock's instant zero; a whole number of
/// seconds, so that record times and their differences are exact.
private let wallZero = WallTime(timeIntervalSince1970: 1_700_000_000)

/// A record of version `version`, issued `age` seconds before `now` (a wall time), living `lifetime` seconds
/// (nil: no expiry).
private func record(
    version: UInt64 = 7, issuedSecondsAgo age: Double, lifetime: Double?, now: WallTime = wallZero,
    accessToken: String = "stored-token"
) -> StoredToken {
    let issuedAt = now.addingTimeInterval(-age)
    return StoredToken(
        accessToken: accessToken, tokenType: "Bearer", scope: "read write", version: version, issuedAt: issuedAt,
        expiresAt: lifetime.map { issuedAt.addingTimeInterval($0) })
}

extension MachineHarness {
    /// The wall-clock time of the current instant.
    fileprivate var wallTime: WallTime { wallZero.addingTimeInterval(now.offset.inSeconds) }

    /// The store's record has been read at the current instant.
    fileprivate mutating func load(_ stored: StoredToken?) {
        record(machine.storeLoaded(stored, now: now, wallTime: wallTime))
    }

    /// A forced refresh's waiter, as `POST /token/refresh` registers it after `.refreshing`.
    fileprivate mutating func waitForRefresh(after: UInt64?, for timeout: Duration) -> UInt64 {
        let (id, actions) = machine.addWaiter(
            after: after, deadline: now.advanced(by: timeout), forRefresh: true, now: now)
        record(actions)
        return id
    }
}

/// The state machine with a token store: nothing is fetched before the record is read, a valid
/// record is served as the token it was, on its own schedule, and versions go on from it.
@Suite struct ProviderStoreMachineTests {
    @Test func noFetchStartsBeforeTheRecordIsRead() {
        var harness = MachineHarness.awaitingStore()
        #expect(harness.machine.awaitingStore)
        harness.start()
        #expect(harness.fetchesStarted == 0, "start waits for the record")
        let waiter = harness.wait(after: nil, for: .seconds(30))
        #expect(harness.fetchesStarted == 0, "a waiter waits for the record too")
        #expect(harness.outcomes[waiter] == nil)
        guard case .refreshing = harness.forceRefresh(rejected: nil) else {
            Issue.record("a forced refresh while the record is read should wait for it")
            return
        }
        guard case .refreshing = harness.forceRefresh(rejected: 3) else {
            Issue.record("a forced refresh of a version while the record is read should wait for it")
            return
        }
        #expect(harness.read().token == nil)
        harness.tick(at: .seconds(1))
        #expect(harness.fetchesStarted == 0, "neither a read nor the timer fetches before the record")
        #expect(!harness.machine.isFetching)
        #expect(harness.machine.phase(at: harness.now) == .expired)

        harness.load(nil)
        #expect(!harness.machine.awaitingStore)
        #expect(harness.fetchesStarted == 1, "the fetch everybody asked for, once")
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the waiter should get the fetched token")
            return
        }
        #expect(token.version == 1, "without a record, versions start at 1")
    }

    @Test func aSecondLoadChangesNothing() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.load(nil)
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        let before = harness.machine.cached
        harness.load(record(version: 40, issuedSecondsAgo: 0, lifetime: 100))
        #expect(harness.machine.cached == before, "only the first load counts")
        #expect(harness.machine.cached?.version == 1)
        #expect(harness.fetchesStarted == 1)
    }

    @Test func aValidRecordIsServedWithItsOwnVersionExpiryAndDates() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        let early = harness.wait(after: nil, for: .seconds(30))
        let older = harness.wait(after: 3, for: .seconds(30))
        let current = harness.wait(after: 7, for: .seconds(30))
        let stored = record(version: 7, issuedSecondsAgo: 50, lifetime: 100)
        harness.load(stored)

        #expect(harness.fetchesStarted == 0, "a fresh record needs no fetch")
        for id in [early, older] {
            guard case .token(let token, let stale)? = harness.outcomes[id] else {
                Issue.record("waiter \(id) should be answered by the record")
                continue
            }
            #expect(token.version == 7)
            #expect(token.token.accessToken == "stored-token")
            #expect(!stale)
        }
        #expect(harness.outcomes[current] == nil, "a waiter that holds version 7 waits for a newer one")
        #expect(harness.machine.waiterCount == 1)

        let read = harness.read()
        guard let token = read.token else {
            Issue.record("the record should be served")
            return
        }
        #expect(!read.stale)
        #expect(token.version == 7)
        #expect(token.token.accessToken == "stored-token")
        #expect(token.token.tokenType == "Bearer")
        #expect(token.token.scope == "read write")
        #expect(token.expiresAt == harness.now.advanced(by: .seconds(50)), "the record's own expiry")
        #expect(token.issuedAt == harness.now.advanced(by: .seconds(-50)), "issued 50 s before now")
        #expect(token.secondsLeft(at: harness.now) == 50)
        #expect(token.issuedAtDate == stored.issuedAt)
        #expect(token.expiresAtDate == stored.expiresAt)
        #expect(StoredToken(token) == stored, "saving it again gives the same record")
        #expect(harness.machine.phase(at: harness.now) == .fresh)
        #expect(harness.fetchesStarted == 0)
    }

    /// A record written by a broker whose clock ran 40 s ahead, 50 s into its 100 s lifetime:
    /// dated by that clock, it reads as issued 10 s ago, and was served until 40 s past its
    /// expiry (a review: served 17 s past it, `stale` false). Placed by the store's
    /// clock (Redis said 50 s are left), it is served 50 s and no more, and is refreshed where
    /// its lifetime puts the refresh from its real issue.
    @Test func aRecordFromAClockRunningAheadIsServedUntilItsExpiryOnceTheStoreHasPlacedIt() {
        let written = record(issuedSecondsAgo: 50 - 40, lifetime: 100)
        var unplaced = MachineHarness.awaitingStore()
        unplaced.start()
        unplaced.load(written)
        #expect(unplaced.read().token?.secondsLeft(at: unplaced.now) == 90, "without the store's clock: 40 s too long")

        let placed = written.placed(expiringWithin: .seconds(50), askedAt: wallZero)
        #expect(placed.issuedAt == wallZero.addingTimeInterval(-50))
        #expect(placed.expiresAt == wallZero.addingTimeInterval(50))
        var harness = MachineHarness.awaitingStore(jitter: .fixed(0))
        harness.start()
        harness.load(placed)
        guard let token = harness.read().token else {
            Issue.record("the record should be served")
            return
        }
        #expect(token.secondsLeft(at: harness.now) == 50)
        #expect(token.issuedAt == harness.now.advanced(by: .seconds(-50)))
        #expect(token.expiresAtDate == wallZero.addingTimeInterval(50))
        #expect(harness.nextFetchDelay == .seconds(25), "75 % of 100 s from its real issue")
        #expect(token.isValid(at: harness.now.advanced(by: .milliseconds(49_999))))
        #expect(!token.isValid(at: harness.now.advanced(by: .seconds(50))), "never served past its expiry")
    }

    /// What a store's clock says places a record only later: a record from a clock that agrees
    /// with this one's (within `placingSlack`) or runs behind it, or of a token without expiry,
    /// is left as written.
    @Test func aRecordIsPlacedOnlyWhenItsExpiryLiesPastWhatTheStoreGivesIt() {
        let written = record(issuedSecondsAgo: 50, lifetime: 100)
        #expect(written.placed(expiringWithin: .seconds(50), askedAt: wallZero) == written)
        #expect(written.placed(expiringWithin: .milliseconds(49_950), askedAt: wallZero) == written, "within the slack")
        #expect(written.placed(expiringWithin: .seconds(80), askedAt: wallZero) == written, "a writer behind")
        let ahead = written.placed(expiringWithin: .seconds(20), askedAt: wallZero)
        #expect(ahead.expiresAt == wallZero.addingTimeInterval(20))
        #expect(ahead.issuedAt == wallZero.addingTimeInterval(-80))
        #expect(ahead.expiresAt.map { $0.timeIntervalSince(ahead.issuedAt) } == 100, "its lifetime kept")
        #expect(
            written.placed(expiringWithin: .zero, askedAt: wallZero).isValid(at: wallZero) == false,
            "nothing left: expired")
        let endless = record(issuedSecondsAgo: 50, lifetime: nil)
        #expect(endless.placed(expiringWithin: .seconds(1), askedAt: wallZero) == endless)
    }

    /// 50 s into a 100 s lifetime: the refresh falls at 75–85 % of it counted from the record's
    /// issue, so 25–35 s from now, not 75–85 s from now.
    @Test(arguments: [(0.0, 25.0), (0.5, 30.0), (0.999_999, 35.0)])
    func theRefreshIsDueWhereTheRecordsLifetimePutsItFromItsIssue(unit: Double, expected: Double) {
        var harness = MachineHarness.awaitingStore(jitter: .fixed(unit))
        harness.start()
        harness.load(record(issuedSecondsAgo: 50, lifetime: 100))
        guard let delay = harness.nextFetchDelay else {
            Issue.record("a refresh should be planned")
            return
        }
        #expect(abs(delay.inSeconds - expected) < 0.001, "due \(delay) from now")
        #expect(delay >= .seconds(25) && delay <= .seconds(35))
        harness.tick(at: harness.now.offset + delay - .milliseconds(1))
        #expect(harness.fetchesStarted == 0)
        harness.tick(at: harness.now.offset + .milliseconds(1))
        #expect(harness.fetchesStarted == 1, "the refresh starts when due")
    }

    @Test func aRecordWithoutExpiryIsRefreshedAfterTokenRefreshDelayFromItsIssue() {
        var harness = MachineHarness.awaitingStore(ProviderConfiguration(tokenRefreshDelaySec: 300))
        harness.start()
        harness.load(record(issuedSecondsAgo: 100, lifetime: nil))
        #expect(harness.read().token?.version == 7)
        #expect(harness.read().token?.expiresAt == nil)
        #expect(harness.nextFetchDelay == .seconds(200))
        #expect(harness.fetchesStarted == 0)
    }

    @Test func aRecordPastItsRefreshPointIsServedAndRefreshedAtOnce() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        let waiter = harness.wait(after: nil, for: .seconds(30))
        // Issued 95 s ago with a 100 s lifetime: valid 5 s more, its refresh (80 s) is past.
        harness.load(record(issuedSecondsAgo: 95, lifetime: 100))
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the record is still valid: it answers the waiter")
            return
        }
        #expect(token.version == 7)
        #expect(harness.read().token?.version == 7)
        #expect(harness.machine.nextWakeup == harness.now, "the refresh is due now")
        harness.tick(at: harness.now.offset)
        #expect(harness.fetchesStarted == 1, "fetched at once, not later")
        #expect(harness.read().token?.version == 7, "served while the refresh runs")
        harness.succeed(lifetime: .seconds(100))
        #expect(harness.read().token?.version == 8)
    }

    @Test func anExpiredRecordIsNotServedAndTheFetchStarts() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        let waiter = harness.wait(after: nil, for: .seconds(30))
        harness.load(record(issuedSecondsAgo: 101, lifetime: 100))
        #expect(harness.outcomes[waiter] == nil, "an expired token answers nobody")
        #expect(harness.machine.cached == nil)
        #expect(harness.read().token == nil)
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the waiter should get the fetched token")
            return
        }
        #expect(token.token.accessToken == "token-1")
    }

    @Test func aRecordExpiringExactlyNowIsExpired() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.load(record(issuedSecondsAgo: 100, lifetime: 100))
        #expect(harness.machine.cached == nil)
        #expect(harness.fetchesStarted == 1)
    }

    @Test func withoutARecordTheWaitedForFetchStartsAndNoOtherOne() {
        var background = MachineHarness.awaitingStore()
        background.start()
        background.load(nil)
        #expect(background.fetchesStarted == 1)

        // On demand nobody asked: nothing to fetch.
        var onDemand = MachineHarness.awaitingStore(ProviderConfiguration(backgroundRefreshEnabled: false))
        onDemand.start()
        onDemand.load(nil)
        #expect(onDemand.fetchesStarted == 0)

        // On demand with a caller: its fetch.
        var asked = MachineHarness.awaitingStore(ProviderConfiguration(backgroundRefreshEnabled: false))
        asked.start()
        let waiter = asked.wait(after: nil, for: .seconds(30), onDemand: true)
        #expect(asked.fetchesStarted == 0)
        asked.load(nil)
        #expect(asked.fetchesStarted == 1)
        asked.succeed()
        guard case .token(let token, _)? = asked.outcomes[waiter] else {
            Issue.record("the caller should get its token")
            return
        }
        #expect(token.version == 1)
    }

    @Test func onDemandWaitersFetchEvenWithAValidRecord() {
        var harness = MachineHarness.awaitingStore(ProviderConfiguration(backgroundRefreshEnabled: false))
        harness.start()
        let waiter = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        harness.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        #expect(harness.outcomes[waiter] == nil, "an on-demand call wants a token fetched for it")
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the caller should get the token fetched for it")
            return
        }
        #expect(token.version == 8, "versions go on from the record's")
        #expect(harness.machine.fetchDueAt == nil, "on demand plans no refresh")
    }

    @Test func onDemandWithoutWaitersKeepsAValidRecordAndFetchesNothing() {
        var harness = MachineHarness.awaitingStore(ProviderConfiguration(backgroundRefreshEnabled: false))
        harness.start()
        harness.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        #expect(harness.fetchesStarted == 0)
        #expect(harness.machine.fetchDueAt == nil)
        guard case .onDemand(let cached) = harness.machine.read(now: harness.now).read else {
            Issue.record("an on-demand provider reads on demand")
            return
        }
        #expect(cached?.version == 7, "the record is the previous token the proxy reuses")
        // The next call wants a new fetch and gets version 8.
        let waiter = harness.wait(after: nil, for: .seconds(30), onDemand: true)
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the caller should get the token fetched for it")
            return
        }
        #expect(token.version == 8)
    }

    @Test func aLaterFetchedTokenGetsTheNextVersionAndTheSameTokenKeepsIt() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.load(record(version: 41, issuedSecondsAgo: 50, lifetime: 100))
        harness.runTimers(until: .seconds(30)) { $0.succeed(lifetime: .seconds(100), accessToken: "stored-token") }
        #expect(harness.fetchesStarted == 1)
        #expect(harness.read().token?.version == 41, "the same token again keeps its version")
        #expect(
            harness.read().token?.expiresAt == harness.now.advanced(by: .seconds(100)), "with the expiry just learned")
        // The renewed token is refreshed at 80 % of its 100 s: at 110 s.
        harness.runTimers(until: .seconds(110)) { $0.succeed(lifetime: .seconds(100)) }
        #expect(harness.fetchesStarted == 2)
        #expect(harness.read().token?.version == 42, "a new token: the record's version + 1")
    }

    @Test func aForcedRefreshOfAnOlderVersionAfterTheLoadGetsTheRecord() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        guard case .current(let token) = harness.forceRefresh(rejected: 6) else {
            Issue.record("version 6 is older than the record's")
            return
        }
        #expect(token.version == 7)
        guard case .refreshing = harness.forceRefresh(rejected: 7) else {
            Issue.record("the record's version is the current one: it is refreshed")
            return
        }
        #expect(harness.fetchesStarted == 1)
    }

    /// A client that held version 7 before the restart has it refused and asks for a refresh while
    /// the record (version 7, the very token refused) is being read. `POST /token/refresh`
    /// registers its waiter with `after: 7, forRefresh: true` (`after ?? rejected`). Once the
    /// record is read, version 7 is the current version, so the forced refresh must go ahead, as
    /// it would for the current version at any other time.
    @Test func aForcedRefreshOfTheRecordsVersionAskedWhileLoadingStillRefreshes() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        guard case .refreshing(let after) = harness.forceRefresh(rejected: 7) else {
            Issue.record("a forced refresh while the record is read should wait for it")
            return
        }
        let waiter = harness.waitForRefresh(after: after ?? 7, for: .seconds(30))
        harness.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        #expect(harness.outcomes[waiter] == nil, "the refused token does not answer its own refresh")
        #expect(
            harness.fetchesStarted == 1,
            "the forced refresh of the current version (the record's) must fetch; it was dropped")
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the forced refresh's waiter should get the fetched token")
            return
        }
        #expect(token.version == 8)
    }

    /// A forced refresh without a version, asked while the record is read, fetches too, and its
    /// waiter is answered by the fetch, not by the stored token.
    @Test func aForcedRefreshWithoutAVersionAskedWhileLoadingFetchesAndIsAnsweredByIt() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        guard case .refreshing(let after) = harness.forceRefresh(rejected: nil) else {
            Issue.record("a forced refresh while the record is read should wait for it")
            return
        }
        let waiter = harness.waitForRefresh(after: after, for: .seconds(30))
        harness.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        #expect(harness.outcomes[waiter] == nil, "the stored token does not answer a refresh")
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        guard case .token(let token, _)? = harness.outcomes[waiter] else {
            Issue.record("the forced refresh's waiter should get the fetched token")
            return
        }
        #expect(token.token.accessToken == "token-1")
    }

    /// An expired record is not served, but its version is kept: the next token is numbered
    /// after it, so versions and ETags never go back across a restart.
    @Test func anExpiredRecordsVersionIsCarriedOver() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.load(record(version: 7, issuedSecondsAgo: 200, lifetime: 100))
        #expect(harness.machine.cached == nil)
        harness.succeed()
        #expect(harness.machine.cached?.version == 8)
    }

    /// A record that may not be served (made under other settings) still numbers what follows.
    @Test func aStoredVersionWithoutARecordToServeIsCarriedOver() {
        var harness = MachineHarness.awaitingStore()
        harness.start()
        harness.record(
            harness.machine.storeLoaded(nil, storedVersion: 12, now: harness.now, wallTime: harness.wallTime))
        #expect(harness.machine.cached == nil)
        #expect(harness.fetchesStarted == 1)
        harness.succeed()
        #expect(harness.machine.cached?.version == 13)
    }

    /// A provider that replaces another at a reload reads the record the old one saved: the same
    /// access token, which keeps its version when numbered after the old provider's, so that a
    /// long-poll holding it is not answered with it again. Another token is renumbered.
    @Test func aReplacementServingTheOldProvidersTokenKeepsItsVersion() {
        var old = MachineHarness.awaitingStore()
        old.start()
        old.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        let oldToken = old.machine.cached

        var replacement = MachineHarness.awaitingStore()
        replacement.start()
        replacement.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100))
        replacement.machine.numberAfter(old.machine.highestVersion, keeping: oldToken)
        #expect(replacement.machine.cached?.version == 7, "the same token under the same version")
        let longPoll = replacement.wait(after: 7, for: .seconds(100))
        #expect(replacement.outcomes[longPoll] == nil, "a client holding version 7 has this token")
        replacement.tick(at: .seconds(70))
        replacement.succeed()
        guard case .token(let token, _)? = replacement.outcomes[longPoll] else {
            Issue.record("the next token answers the long-poll")
            return
        }
        #expect(token.version == 8)
        #expect(token.token.accessToken == "token-1")

        var other = MachineHarness.awaitingStore()
        other.start()
        other.load(record(version: 7, issuedSecondsAgo: 10, lifetime: 100, accessToken: "another-token"))
        other.machine.numberAfter(7, keeping: oldToken)
        #expect(other.machine.cached?.version == 8, "another token than the old provider's is a new version")
    }

    /// The old provider's version is kept only while no higher one has been seen since: a record
    /// read afterwards at version 9 (expired, so not served) means 5 is no longer the newest,
    /// and the same token fetched then is a new version after 9, never 5 again.
    @Test func anInheritedVersionBelowOneTheStoreShowedIsNotUsed() {
        var old = MachineHarness.awaitingStore()
        old.start()
        old.load(record(version: 5, issuedSecondsAgo: 10, lifetime: 100, accessToken: "token-1"))
        let oldToken = old.machine.cached
        #expect(oldToken?.version == 5)

        var replacement = MachineHarness.awaitingStore()
        replacement.start()
        replacement.machine.numberAfter(5, keeping: oldToken)
        replacement.load(record(version: 9, issuedSecondsAgo: 200, lifetime: 100, accessToken: "token-0"))
        replacement.succeed(accessToken: "token-1")
        #expect(replacement.machine.cached?.version == 10)
    }
}

/// A store in memory, for the provider's tests: it counts its loads and keeps every save. With
/// `gated`, a load waits until `open()`, so that a test can act while the record is being read.
private final class MemoryStore: TokenStore {
    private struct State {
        var records: [String: StoredToken] = [:]
        var answer: StoreLoad?
        var loads: [String] = []
        var saves: [(key: String, record: StoredToken)] = []
        var gateOpen: Bool
        var parked: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Lock<State>

    /// A store holding `records`; `answer`, when given, is what every load says instead.
    init(_ records: [String: StoredToken] = [:], answer: StoreLoad? = nil, gated: Bool = false) {
        state = Lock(State(records: records, answer: answer, gateOpen: !gated))
    }

    var loads: [String] { state.withLock { $0.loads } }
    var saves: [(key: String, record: StoredToken)] { state.withLock { $0.saves } }
    var parkedCount: Int { state.withLock { $0.parked.count } }

    func open() {
        let parked = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.gateOpen = true
            defer { state.parked = [] }
            return state.parked
        }
        for continuation in parked { continuation.resume() }
    }

    func load(_ key: String) async -> StoreLoad {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = state.withLock { state -> Bool in
                state.loads.append(key)
                if state.gateOpen { return true }
                state.parked.append(continuation)
                return false
            }
            if proceed { continuation.resume() }
        }
        return state.withLock { state in
            if let answer = state.answer { return answer }
            return state.records[key].map { .found($0) } ?? .missing
        }
    }

    func save(_ key: String, _ record: StoredToken) {
        state.withLock { state in
            state.records[key] = record
            state.saves.append((key, record))
        }
    }
}

/// What the provider reported of its store's load.
private final class LoadReports: Sendable {
    let reports = Lock<[(name: String, load: StoreLoad, served: Bool)]>([])
    var events: ProviderEvents {
        ProviderEvents(storeLoaded: { name, load, served in self.reports.withLock { $0.append((name, load, served)) } })
    }
    var all: [(name: String, load: StoreLoad, served: Bool)] { reports.withLock { $0 } }
}

/// The provider with a store, on a manual clock whose instant zero is `wallZero` by the injected wall clock.
@Suite struct ProviderStoreTokenProviderTests {
    private struct Setup {
        let clock = ManualClock()
        let source: ScriptedSource
        let store: MemoryStore
        let reports = LoadReports()
        let provider: TokenProvider<ManualClock>

        init(
            _ configuration: ProviderConfiguration = ProviderConfiguration(name: "orders", tokenRefreshDelaySec: 300),
            source: ScriptedSource = ScriptedSource([.token(lifetime: .seconds(120))]), store: MemoryStore,
            key: String = "orders"
        ) {
            self.source = source
            self.store = store
            let clock = clock
            provider = TokenProvider(
                configuration: configuration, source: source, clock: clock, jitter: .fixed(0.5),
                events: reports.events,
                wallClock: { wallZero.addingTimeInterval(clock.now.offset.inSeconds) },
                store: StoreSlot(store: store, key: key))
        }
    }

    /// Starts `provider.run()` in a task the test owns, and stops it at the end.
    private func withRunning<T>(_ provider: TokenProvider<ManualClock>, _ body: () async throws -> T) async rethrows
        -> T
    {
        let service = Task { await provider.run() }
        defer { service.cancel() }
        return try await body()
    }

    private func currentToken(_ provider: TokenProvider<ManualClock>) -> CachedToken<ManualClock.Instant>? {
        if case .token(let token, _, _) = provider.read() { return token }
        return nil
    }

    @Test func runLoadsTheRecordThenServesItWithoutCallingTheSource() async {
        let stored = record(version: 7, issuedSecondsAgo: 50, lifetime: 100)
        let setup = Setup(store: MemoryStore(["orders": stored]))
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { provider.status().version == 7 })
            #expect(setup.store.loads == ["orders"])
            let token = currentToken(provider)
            #expect(token?.token.accessToken == "stored-token")
            #expect(token?.expiresAt == setup.clock.now.advanced(by: .seconds(50)))
            #expect(token?.issuedAtDate == stored.issuedAt)
            #expect(provider.status().phase == .fresh)
            guard case .token(let waited, _) = await provider.onTokenReady(timeout: .seconds(1)) else {
                Issue.record("a waiter should get the record at once")
                return
            }
            #expect(waited.version == 7)
            #expect(await eventually { setup.clock.sleeperCount == 1 }, "the refresh timer is armed")
            #expect(setup.source.fetchCount == 0, "a fresh record needs no fetch")
            #expect(setup.store.saves.isEmpty, "nothing new to save")
            let reports = setup.reports.all
            #expect(reports.count == 1)
            #expect(reports.first?.name == "orders")
            #expect(reports.first?.load == .found(stored))
            #expect(reports.first?.served == true)
        }
    }

    @Test func theRecordIsRefreshedOnItsScheduleAndTheFetchedTokenIsSaved() async {
        let stored = record(version: 7, issuedSecondsAgo: 50, lifetime: 100)
        let setup = Setup(store: MemoryStore(["orders": stored]))
        let provider = setup.provider
        let clock = setup.clock
        await withRunning(provider) {
            #expect(await eventually { provider.status().version == 7 && clock.sleeperCount == 1 })
            // 80 % of 100 s from an issue 50 s ago: 30 s from now.
            clock.advance(by: .seconds(29))
            _ = provider.read()
            #expect(setup.source.fetchCount == 0)
            clock.advance(by: .seconds(1))
            #expect(await eventually { provider.status().version == 8 })
            #expect(setup.source.fetchCount == 1)
            #expect(await eventually { setup.store.saves.count == 1 })
            guard let saved = setup.store.saves.first else { return }
            #expect(saved.key == "orders")
            #expect(
                saved.record
                    == StoredToken(
                        accessToken: "token-1", tokenType: "Bearer", scope: nil, version: 8,
                        issuedAt: wallZero.addingTimeInterval(30), expiresAt: wallZero.addingTimeInterval(150)))
        }
    }

    @Test func aRecordPastItsRefreshPointIsServedAndFetchedAtOnce() async {
        let setup = Setup(store: MemoryStore(["orders": record(version: 7, issuedSecondsAgo: 95, lifetime: 100)]))
        let provider = setup.provider
        await withRunning(provider) {
            // The clock never moves: the refresh is due at once.
            #expect(await eventually { provider.status().version == 8 })
            #expect(setup.source.fetchCount == 1)
            #expect(await eventually { setup.store.saves.count == 1 })
            #expect(setup.store.saves.first?.record.version == 8)
            #expect(setup.store.saves.first?.record.issuedAt == wallZero)
            #expect(setup.store.saves.first?.record.expiresAt == wallZero.addingTimeInterval(120))
            #expect(setup.reports.all.first?.served == true)
        }
    }

    @Test func anExpiredRecordIsNotServedAndAFetchedTokenReplacesIt() async {
        let stored = record(version: 7, issuedSecondsAgo: 200, lifetime: 100)
        let setup = Setup(store: MemoryStore(["orders": stored]))
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { setup.store.saves.count == 1 })
            #expect(setup.source.fetchCount == 1)
            #expect(currentToken(provider)?.token.accessToken == "token-1")
            #expect(setup.store.saves.first?.record.accessToken == "token-1")
            #expect(setup.reports.all.first?.load == .found(stored))
            #expect(setup.reports.all.first?.served == false)
        }
    }

    /// A record made under other settings of the provider (another issuer, scope or key) is
    /// refused, not served; the token fetched instead is saved with the provider's settings and
    /// numbered after the record.
    @Test func aRecordMadeUnderOtherSettingsIsRefusedAndItsVersionCarriedOver() async {
        var stored = record(version: 7, issuedSecondsAgo: 10, lifetime: 100)
        stored.settings = "old-settings"
        let store = MemoryStore(["orders": stored])
        let clock = ManualClock()
        let source = ScriptedSource([.token(lifetime: .seconds(120))])
        let reports = LoadReports()
        let provider = TokenProvider(
            configuration: ProviderConfiguration(name: "orders", tokenRefreshDelaySec: 300), source: source,
            clock: clock, jitter: .fixed(0.5), events: reports.events,
            wallClock: { wallZero.addingTimeInterval(clock.now.offset.inSeconds) },
            store: StoreSlot(store: store, key: "orders", settings: "new-settings"))
        await withRunning(provider) {
            #expect(await eventually { store.saves.count == 1 })
            #expect(source.fetchCount == 1)
            #expect(currentToken(provider)?.token.accessToken == "token-1")
            #expect(provider.status().version == 8)
            #expect(store.saves.first?.record.settings == "new-settings")
            guard case .refused(let reason)? = reports.all.first?.load else {
                Issue.record("the record should be reported refused")
                return
            }
            #expect(reason.contains("other settings"))
            #expect(!reason.contains("stored-token"))
        }
    }

    @Test(arguments: [StoreLoad.missing, .refused("does not authenticate")])
    func withoutAUsableRecordTheFirstFetchIsVersionOneAndIsSaved(load: StoreLoad) async {
        let setup = Setup(store: MemoryStore(answer: load))
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { setup.store.saves.count == 1 })
            #expect(setup.source.fetchCount == 1)
            #expect(provider.status().version == 1)
            #expect(
                setup.store.saves.first?.record
                    == StoredToken(
                        accessToken: "token-1", tokenType: "Bearer", scope: nil, version: 1, issuedAt: wallZero,
                        expiresAt: wallZero.addingTimeInterval(120)))
            #expect(setup.reports.all.first?.load == load)
            #expect(setup.reports.all.first?.served == false)
        }
    }

    @Test func nothingIsFetchedWhileTheRecordIsBeingRead() async {
        let setup = Setup(store: MemoryStore(gated: true))
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { setup.store.parkedCount == 1 })
            let waiter = Task { await provider.onTokenReady(timeout: .seconds(30)) }
            #expect(await eventually { provider.status().waiters == 1 })
            guard case .refreshing = provider.forceRefresh(rejected: nil) else {
                Issue.record("a forced refresh while the record is read should wait for it")
                return
            }
            _ = provider.read()
            #expect(setup.source.fetchCount == 0, "no fetch before the record is read")
            #expect(provider.status().phase != .refreshing)
            setup.store.open()
            guard case .token(let token, _) = await waiter.value else {
                Issue.record("the waiter should get the fetched token")
                return
            }
            #expect(token.version == 1)
            #expect(setup.source.fetchCount == 1, "one fetch for everybody")
        }
    }

    @Test func anOnDemandCallFetchesEvenWithAValidRecordAndGoesOnFromItsVersion() async {
        let setup = Setup(
            ProviderConfiguration(name: "orders", backgroundRefreshEnabled: false),
            store: MemoryStore(["orders": record(version: 7, issuedSecondsAgo: 10, lifetime: 100)]))
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { setup.reports.all.count == 1 })
            guard case .onDemand(let cached) = provider.read() else {
                Issue.record("an on-demand provider reads on demand")
                return
            }
            #expect(cached?.version == 7)
            #expect(setup.source.fetchCount == 0)
            guard case .token(let token, _) = await provider.onTokenReady(timeout: .seconds(30), onDemand: true) else {
                Issue.record("the call should get a token fetched for it")
                return
            }
            #expect(token.version == 8)
            #expect(token.token.accessToken == "token-1")
            #expect(setup.source.fetchCount == 1)
            #expect(await eventually { setup.store.saves.count == 1 })
            #expect(setup.store.saves.first?.record.version == 8)
        }
    }

    @Test func theSlotsKeyIsTheOneLoadedAndSaved() async {
        let key = StoreSlot.key(provider: "orders", values: TokenRequestValues(audience: "https://api.example"))
        let setup = Setup(store: MemoryStore(), key: key)
        let provider = setup.provider
        await withRunning(provider) {
            #expect(await eventually { setup.store.saves.count == 1 })
            #expect(setup.store.loads == [key])
            #expect(setup.store.saves.map(\.key) == [key])
        }
    }

    @Test func aSlotsKeyIsTheProviderNameThenEachValueNamedOnALineOfItsOwn() {
        #expect(StoreSlot.key(provider: "orders") == "orders")
        #expect(
            StoreSlot.key(
                provider: "t",
                values: TokenRequestValues(
                    audience: "https://api.example", scopes: ["write", "read"], resource: "urn:r"))
                == "t\naudience=https://api.example\nscope=read write\nresource=urn:r")
        #expect(
            StoreSlot.key(provider: "t", values: TokenRequestValues(scopes: ["read"]))
                != StoreSlot.key(provider: "t", values: TokenRequestValues(audience: "read")))
    }
}
