import Dispatch
import Foundation
import Glibc
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerTestSupport

@testable import TokenBrokerStore

/// Why a redis-server could not be run or answered something unexpected.
private struct RedisTestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A redis-server of the test's own, on a Unix socket in a private temporary folder (never a
/// TCP port: `--port 0`), with nothing saved to disk. Spawned as a child of the test process,
/// with no descriptor of the test's but its log, and killed (and reaped) by `kill()` or at the end.
private final class RedisServer: @unchecked Sendable {
    let folder: TemporaryDirectory
    let socket: String
    let password: String?
    private let pid = Mutex<pid_t>(0)

    /// A server started and answering `PING`.
    static func started(password: String? = nil) async throws -> RedisServer {
        let server = try RedisServer(password: password)
        try await server.start()
        return server
    }

    private init(password: String?) throws {
        // A write to a connection Redis closed must fail with EPIPE, not end the test process (the
        // broker ignores SIGPIPE too).
        signal(SIGPIPE, SIG_IGN)
        folder = try TemporaryDirectory()
        socket = folder.path("redis.sock")
        self.password = password
    }

    deinit { kill() }

    /// Starts redis-server (again, on the same socket) and waits until it answers `PING`.
    func start() async throws {
        var arguments = [
            "--port", "0", "--unixsocket", socket, "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
            "--dir", folder.url.path, "--logfile", folder.path("redis.log"),
        ]
        if let password { arguments += ["--requirepass", password] }
        let child = try Self.spawn("/usr/bin/redis-server", arguments)
        pid.withLock { $0 = child }
        let end = ContinuousClock.now.advanced(by: .seconds(20))
        while ContinuousClock.now < end {
            if let connection = try? admin(), case .status("PONG")? = try? connection.command([Array("PING".utf8)]) {
                return
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        let log = (try? String(contentsOfFile: folder.path("redis.log"), encoding: .utf8)) ?? ""
        throw RedisTestFailure("redis-server did not answer PING on \(socket): \(log)")
    }

    /// Kills the server at once (SIGKILL: no goodbye to its clients) and reaps it.
    func kill() {
        let child = pid.withLock { pid -> pid_t in
            defer { pid = 0 }
            return pid
        }
        guard child > 0 else { return }
        Glibc.kill(child, SIGKILL)
        var status: Int32 = 0
        while waitpid(child, &status, 0) < 0, errno == EINTR {}
    }

    /// A connection of the test's own, as the server's administrator.
    func admin(database: Int = 0) throws -> RedisConnection {
        var settings = RedisStoreSettings(address: .unix(socket), keyFile: "/unused")
        settings.timeoutMsec = 5000
        settings.database = database
        return try RedisConnection.connect(settings, password: password)
    }

    /// Runs one command as the administrator.
    @discardableResult
    func command(_ words: String..., database: Int = 0) throws -> RedisConnection.Reply {
        try admin(database: database).command(words.map { Array($0.utf8) })
    }

    /// The bytes kept under `name`, or nil when there are none.
    func bytes(_ name: String, database: Int = 0) throws -> [UInt8]? {
        switch try command("GET", name, database: database) {
        case .string(let bytes): return bytes
        case .null: return nil
        case let other: throw RedisTestFailure("GET \(name) answered \(other)")
        }
    }

    /// The number of subscribers of `channel`.
    func subscribers(_ channel: String) -> Int64 {
        guard case .array(let parts)? = try? command("PUBSUB", "NUMSUB", channel), parts.count == 2,
            case .integer(let count) = parts[1]
        else { return -1 }
        return count
    }

    /// Spawns `path` with `arguments`: standard input and output on /dev/null, every other
    /// descriptor of the test process closed in the child.
    private static func spawn(_ path: String, _ arguments: [String]) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        // glibc 2.34's posix_spawn_file_actions_addclosefrom_np, which Glibc's module does not show.
        typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
        guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else {
            throw RedisTestFailure("posix_spawn_file_actions_addclosefrom_np is missing")
        }
        guard unsafeBitCast(symbol, to: AddCloseFrom.self)(&actions, 3) == 0 else {
            throw RedisTestFailure("posix_spawn_file_actions_addclosefrom_np failed")
        }
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var child: pid_t = 0
        let spawned = posix_spawn(&child, path, &actions, nil, argv, environ)
        guard spawned == 0 else {
            throw RedisTestFailure("\(path): posix_spawn: \(String(cString: strerror(spawned)))")
        }
        return child
    }
}

/// A token issuer for the store's fetches: counts its calls, names its tokens after itself, can
/// fail its first calls, and with `gated` holds every call until `open()`.
private final class Issuer: Sendable {
    private struct State {
        var calls = 0
        var failuresLeft: Int
        var gateOpen: Bool
        var parked: [CheckedContinuation<Void, Never>] = []
    }

    let name: String
    /// Its tokens' lifetime; nil: tokens without expiry.
    let lifetime: Duration?
    private let state: Mutex<State>

    init(_ name: String, lifetime: Duration? = .seconds(300), failures: Int = 0, gated: Bool = false) {
        self.name = name
        self.lifetime = lifetime
        state = Mutex(State(failuresLeft: failures, gateOpen: !gated))
    }

    var calls: Int { state.withLock { $0.calls } }
    var parkedCount: Int { state.withLock { $0.parked.count } }

    /// The source as `fetchForFleet` takes it.
    var fetch: @Sendable () async throws(TokenFetchError) -> FetchedToken {
        { () async throws(TokenFetchError) -> FetchedToken in try await self.fetchToken() }
    }

    func open() {
        let parked = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.gateOpen = true
            defer { state.parked = [] }
            return state.parked
        }
        for continuation in parked { continuation.resume() }
    }

    private func fetchToken() async throws(TokenFetchError) -> FetchedToken {
        let (number, fails) = state.withLock { state -> (Int, Bool) in
            state.calls += 1
            defer { state.failuresLeft = max(0, state.failuresLeft - 1) }
            return (state.calls, state.failuresLeft > 0)
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = state.withLock { state -> Bool in
                if state.gateOpen { return true }
                state.parked.append(continuation)
                return false
            }
            if proceed { continuation.resume() }
        }
        if fails { throw TokenFetchError.serverError("\(name) is down", httpStatus: 503) }
        return FetchedToken(accessToken: "\(name)-token-\(number)", lifetime: lifetime, scope: "read")
    }
}

/// An issuer that hands out its current token until it nears expiry: the same access token each
/// time, with the life it has left until `expiresAt` by the wall clock.
private final class CurrentTokenIssuer: TokenSource {
    let expiresAt: WallTime
    private let count = Mutex(0)

    init(expiresAt: WallTime) { self.expiresAt = expiresAt }

    var calls: Int { count.withLock { $0 } }

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        count.withLock { $0 += 1 }
        return FetchedToken(accessToken: "same-token", lifetime: .seconds(expiresAt.timeIntervalSince(WallTime())))
    }
}

extension RedisTokenStore {
    /// A fetch for a provider that accepts every record (what it refuses is
    /// `aRecordTheProviderRefusesIsFetchedPastAndReplaced`'s, and the provider's own tests').
    func fetchForFleet(
        _ key: String, settings: String, current: UInt64, forced: Bool,
        fetch: @escaping @Sendable () async throws(TokenFetchError) -> FetchedToken
    ) async -> Result<SharedFetch, TokenFetchError> {
        await fetchForFleet(
            key, settings: settings, current: current, forced: forced, accepts: { _ in true }, fetch: fetch)
    }
}

/// The stores of a test, one per "broker", on its server: each is stopped at the end (`stop()`).
private final class Fleet: Sendable {
    let server: RedisServer
    let sealingKey: [UInt8]
    private let stores = Mutex<[RedisTokenStore]>([])

    init(_ server: RedisServer, sealingKey: [UInt8]) {
        self.server = server
        self.sealingKey = sealingKey
    }

    /// A store on the server, sealing with `key` (the fleet's by default), with the server's
    /// password unless told; `configure` changes its settings.
    func store(
        key: [UInt8]? = nil, password: String?? = .none, events: RedisTokenStore.Events = RedisTokenStore.Events(),
        _ configure: (inout RedisStoreSettings) -> Void = { _ in }
    ) throws -> RedisTokenStore {
        var settings = RedisStoreSettings(address: .unix(server.socket), keyFile: "/unused")
        settings.timeoutMsec = 5000
        configure(&settings)
        let store = try RedisTokenStore(
            settings: settings, password: password ?? server.password, cipher: AESGCM(key: key ?? sealingKey)!,
            events: events)
        stores.withLock { $0.append(store) }
        return store
    }

    /// Stops every store, on a thread of Dispatch's: `stop()` waits for the store's subscriber,
    /// which must not hold one of the few threads that run the tests' tasks.
    func stop() async {
        let all = stores.withLock { stores -> [RedisTokenStore] in
            defer { stores = [] }
            return stores
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                for store in all { store.stop() }
                continuation.resume()
            }
        }
    }
}

/// What a store reported of Redis's reachability.
private final class Reachability: Sendable {
    private let reports = Mutex<[String?]>([])
    var all: [String?] { reports.withLock { $0 } }
    var events: RedisTokenStore.Events {
        var events = RedisTokenStore.Events()
        events.reachability = { problem in self.reports.withLock { $0.append(problem) } }
        return events
    }
}

/// What a store reported of leases that outlive any it takes (`Events.lease`).
private final class Leases: Sendable {
    private let reports = Mutex<[String?]>([])
    var all: [String?] { reports.withLock { $0 } }
    var events: RedisTokenStore.Events {
        var events = RedisTokenStore.Events()
        events.lease = { _, problem in self.reports.withLock { $0.append(problem) } }
        return events
    }
}

/// The `redis` store against a real redis-server: records sealed in Redis, one fetch per refresh
/// for a fleet of stores (one per "broker"), the lease and its fence, and what happens when
/// Redis goes away, refuses the credentials, or is another database.
@Suite struct RedisStoreTests {
    private static let sealingKey = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
    private static let secret = "eyJhbGciOiJSUzI1NiJ9.cmVkaXMtc2VjcmV0.c2lnbmF0dXJl"

    /// Runs `body` with a redis-server of its own and the stores it makes on it (`Fleet`), then
    /// stops every store and kills the server, however `body` ends.
    private func withRedis(
        password: String? = nil, _ body: (RedisServer, Fleet) async throws -> Void
    ) async throws {
        let server = try await RedisServer.started(password: password)
        let fleet = Fleet(server, sealingKey: Self.sealingKey)
        do {
            try await body(server, fleet)
        } catch {
            await fleet.stop()
            server.kill()
            throw error
        }
        await fleet.stop()
        server.kill()
    }

    /// The Redis name of a record's key `key` of kind `kind` (`record:`, `lease:`, `fence:`).
    private func name(_ kind: String, _ key: String, prefix: String = "token-broker:") throws -> String {
        prefix + kind + (try Fingerprint.sha256Hex(key))
    }

    /// The record Redis holds under `key`, opened with the store's key.
    private func storedRecord(
        _ server: RedisServer, _ key: String, database: Int = 0, prefix: String = "token-broker:"
    ) throws -> StoredToken? {
        guard let bytes = try server.bytes(try name("record:", key, prefix: prefix), database: database) else {
            return nil
        }
        return try StoreRecord(cipher: AESGCM(key: Self.sealingKey)!).open(bytes, key: key).get()
    }

    /// A record dated by the wall clock, in whole milliseconds as a record keeps it.
    private static func token(
        version: UInt64, lifetime: Double = 300, accessToken: String = secret, settings: String = ""
    ) -> StoredToken {
        let now = WallTime(timeIntervalSince1970: (WallTime().timeIntervalSince1970 * 1000).rounded() / 1000)
        return StoredToken(
            accessToken: accessToken, tokenType: "Bearer", scope: "read", version: version, issuedAt: now,
            expiresAt: now.addingTimeInterval(lifetime), settings: settings)
    }

    /// Whether two records are the same but for the sub-millisecond part of their times.
    private func same(_ one: StoredToken?, _ other: StoredToken?) -> Bool {
        guard let one, let other else { return one == nil && other == nil }
        func close(_ a: WallTime?, _ b: WallTime?) -> Bool {
            guard let a, let b else { return a == nil && b == nil }
            return abs(a.timeIntervalSince(b)) < 0.002
        }
        return one.accessToken == other.accessToken && one.tokenType == other.tokenType && one.scope == other.scope
            && one.version == other.version && one.settings == other.settings
            && close(one.issuedAt, other.issuedAt) && close(one.expiresAt, other.expiresAt)
    }

    /// A fetch for the fleet's success, or nil (and an issue) for a failure.
    private func success(
        _ result: Result<SharedFetch, TokenFetchError>, sourceLocation: SourceLocation = #_sourceLocation
    ) -> SharedFetch? {
        switch result {
        case .success(let fetched): return fetched
        case .failure(let error):
            Issue.record("the fetch for the fleet failed: \(error.summary)", sourceLocation: sourceLocation)
            return nil
        }
    }

    /// The fleet's fetch of `orders` (settings `s`) by `store`, from `issuer`, for a provider that
    /// accepts every record, given up after 30 s (`bounded`): its success, or nil (and an issue).
    private func fetchedOrders(
        by store: RedisTokenStore, current: UInt64, waiting: FleetWait = FleetWait(), from issuer: Issuer,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async -> SharedFetch? {
        success(
            await bounded {
                await store.fetchForFleet(
                    "orders", settings: "s", current: current, forced: false, waiting: waiting,
                    accepts: { _ in true }, fetch: issuer.fetch)
            }, sourceLocation: sourceLocation)
    }

    /// What `fetching` answered, its task cancelled after 30 s: a broker waiting on a lease for
    /// good would never end by itself.
    private func bounded(
        _ fetching: @escaping @Sendable () async -> Result<SharedFetch, TokenFetchError>
    ) async -> Result<SharedFetch, TokenFetchError> {
        let task = Task { await fetching() }
        let deadline = Task {
            try await Task.sleep(for: .seconds(30))
            task.cancel()
        }
        defer { deadline.cancel() }
        return await task.value
    }

    /// The ids of the connections whose last command was one of the store's calls (not the
    /// subscriber's, nor the test's own), from `CLIENT LIST`.
    private func commandConnections(_ server: RedisServer) throws -> [String] {
        guard case .string(let list) = try server.command("CLIENT", "LIST") else { return [] }
        return String(decoding: list, as: UTF8.self).split(separator: "\n").compactMap { line -> String? in
            let fields = line.split(separator: " ")
            guard let id = fields.first(where: { $0.hasPrefix("id=") }),
                let command = fields.first(where: { $0.hasPrefix("cmd=") }),
                ["cmd=eval", "cmd=getrange", "cmd=pttl", "cmd=ping"].contains(String(command))
            else { return nil }
            return String(id)
        }
    }

    /// Waits until every store's subscriber listens on the channel.
    private func awaitSubscribers(_ server: RedisServer, _ count: Int64, channel: String = "token-broker:records")
        async -> Bool
    {
        await eventually(within: 20) { server.subscribers(channel) >= count }
    }

    // MARK: - load

    @Test func aKeyWithoutARecordIsMissing() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            #expect(await store.load("orders") == .missing)
            #expect(store.currentHealth.reachable)
            #expect(store.currentHealth.lastReachable != nil)
        }
    }

    @Test func aSavedRecordLoadsBackInAnyStoreOfTheFleet() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let other = try fleet.store()
            let token = Self.token(version: 4, settings: "digest")
            store.save("orders", token)
            #expect(await eventually(within: 20) { (try? server.bytes(try name("record:", "orders"))) != nil })
            #expect(await store.load("orders") == .found(token))
            #expect(await other.load("orders") == .found(token), "another broker reads it")
            #expect(await store.load("billing") == .missing, "another key has no record")

            // Kept sealed, under the SHA-256 of the key, until the token expires.
            let bytes = try server.bytes(try name("record:", "orders")) ?? []
            #expect(bytes.starts(with: Array("TBSTORE1".utf8)))
            for text in [Self.secret, "cmVkaXMtc2VjcmV0", "orders", "access_token", "digest"] {
                #expect(!Data(bytes).contains(Data(text.utf8)), "\(text) appears in clear")
            }
            guard case .integer(let left) = try server.command("PTTL", try name("record:", "orders")) else {
                Issue.record("PTTL should answer a number")
                return
            }
            #expect(left > 0 && left <= 300_000, "the record lives as long as its token: \(left) ms")
        }
    }

    @Test func aRecordMadeUnderOtherSettingsIsFoundForTheProviderToRefuse() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let token = Self.token(version: 2, settings: "old-settings")
            store.save("orders", token)
            #expect(await eventually(within: 20) { (try? server.bytes(try name("record:", "orders"))) != nil })
            guard case .found(let found) = await store.load("orders") else {
                Issue.record("the record should be found")
                return
            }
            #expect(found.settings == "old-settings")
            #expect(found == token)
        }
    }

    /// A record from a broker whose clock runs 40 s ahead, of a 60 s token fetched 20 s ago: its
    /// dates say 60 s are left, Redis's time to live (from the lifetime when it was written) 40 s.
    /// Each read places it by Redis's time (load, the fetch for the fleet, the catch-up after the
    /// subscriber connects), so that no broker serves it past its expiry (a review: 17 s
    /// past it). A record from a clock that agrees is read back as written (the tests above).
    @Test func aRecordFromAClockRunningAheadIsPlacedByRedissTimeToLive() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let now = WallTime()
            let written = StoredToken(
                accessToken: "ahead", tokenType: "Bearer", scope: nil, version: 3,
                issuedAt: now.addingTimeInterval(40 - 20), expiresAt: now.addingTimeInterval(40 + 40), settings: "s")
            let sealed = try StoreRecord(cipher: AESGCM(key: Self.sealingKey)!).seal(written, key: "orders")
            _ = try server.admin().command([
                Array("SET".utf8), Array(try name("record:", "orders").utf8), sealed, Array("PX".utf8),
                Array("40000".utf8),
            ])
            func expectPlaced(_ found: StoredToken?, _ what: String) {
                guard let found, let expiresAt = found.expiresAt else {
                    Issue.record("\(what): the record should be found")
                    return
                }
                let left = expiresAt.timeIntervalSince(WallTime())
                #expect(left > 30 && left <= 40.1, "\(what): \(left) s left, as Redis says, not 60")
                #expect(abs(expiresAt.timeIntervalSince(found.issuedAt) - 60) < 0.001, "\(what): its lifetime kept")
                #expect(found.accessToken == "ahead" && found.version == 3 && found.settings == "s")
            }
            guard case .found(let loaded) = await store.load("orders") else {
                Issue.record("the record should load")
                return
            }
            expectPlaced(loaded, "load")
            let issuer = Issuer("a")
            let shared = success(
                await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            #expect(shared?.origin == .fromFleet && issuer.calls == 0)
            expectPlaced(shared?.record, "fetch for the fleet")
            let watcher = try fleet.store()
            let caught = Mutex<StoredToken?>(nil)
            _ = watcher.watch("orders", settings: "s") { stored, _ in caught.withLock { $0 = stored } }
            // The subscriber connects again, and reads what it watches (it may have connected
            // before the watch began).
            #expect(await awaitSubscribers(server, 1))
            try server.command("CLIENT", "KILL", "TYPE", "pubsub")
            #expect(await eventually(within: 20) { caught.withLock { $0 } != nil })
            expectPlaced(caught.withLock { $0 }, "catch-up")
        }
    }

    @Test func aRecordMovedToAnotherKeyOrSealedUnderAnotherKeyIsRefused() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let stranger = try fleet.store(key: Array(repeating: 9, count: 32))
            store.save("orders", Self.token(version: 3))
            #expect(await eventually(within: 20) { (try? server.bytes(try name("record:", "orders"))) != nil })

            // Another provider's key: the record authenticates only under its own.
            let bytes = try #require(try server.bytes(try name("record:", "orders")))
            let moved = try server.admin().command([
                Array("SET".utf8), Array(try name("record:", "billing").utf8), bytes,
            ])
            #expect(moved == .status("OK"))
            guard case .refused(let reason) = await store.load("billing") else {
                Issue.record("a record moved to another key should be refused")
                return
            }
            #expect(reason.contains("does not authenticate"))
            #expect(!reason.contains(Self.secret))

            // Another sealing key: a broker of another fleet sharing the Redis.
            guard case .refused(let other) = await stranger.load("orders") else {
                Issue.record("a record sealed under another key should be refused")
                return
            }
            #expect(other.contains("does not authenticate"))

            // Not a record at all.
            try server.command("SET", try name("record:", "junk"), "hello")
            guard case .refused(let junk) = await store.load("junk") else {
                Issue.record("bytes that are not a record should be refused")
                return
            }
            #expect(junk.contains("TBSTORE1"))
            #expect(!junk.contains("hello"))

            // Not a string.
            try server.command("LPUSH", try name("record:", "list"), "x")
            guard case .refused = await store.load("list") else {
                Issue.record("a key of another type should be refused")
                return
            }
        }
    }

    // MARK: - fetchForFleet

    /// A record fetched for a forced refresh reaches the other brokers marked forced (they count
    /// it in their windows); a scheduled one unmarked; the broker that stored it is not told of
    /// its own record.
    @Test func theChannelSaysWhetherAForcedRefreshFetchedTheRecordAndSkipsTheSender() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let watcher = try fleet.store()
            let heard = Mutex<[(UInt64, Bool)]>([])
            let own = Mutex(0)
            _ = watcher.watch("orders", settings: "s") { record, forced in
                heard.withLock { $0.append((record.version, forced)) }
            }
            _ = store.watch("orders", settings: "s") { _, _ in own.withLock { $0 += 1 } }
            #expect(await awaitSubscribers(server, 2))
            let issuer = Issuer("a")
            guard
                let first = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: true, fetch: issuer.fetch))
            else { return }
            guard
                let second = success(
                    await store.fetchForFleet(
                        "orders", settings: "s", current: first.record.version, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(await eventually(within: 20) { heard.withLock { $0.count } == 2 })
            let messages = heard.withLock { $0 }
            #expect(messages.map(\.0) == [first.record.version, second.record.version])
            #expect(messages.map(\.1) == [true, false])
            #expect(own.withLock { $0 } == 0, "a broker is not told of its own record")
        }
    }

    @Test func withoutARecordTheStoreTakesTheLeaseFetchesOnceStoresAndPublishes() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let watcher = try fleet.store()
            let received = Mutex<[StoredToken]>([])
            let id = watcher.watch("orders", settings: "digest") { record, _ in received.withLock { $0.append(record) }
            }
            let otherSettings = Mutex(0)
            _ = watcher.watch("orders", settings: "other-digest") { _, _ in otherSettings.withLock { $0 += 1 } }
            let otherKey = Mutex(0)
            _ = watcher.watch("billing", settings: "digest") { _, _ in otherKey.withLock { $0 += 1 } }
            #expect(await awaitSubscribers(server, 2))

            let issuer = Issuer("a")
            guard
                let fetched = success(
                    await store.fetchForFleet(
                        "orders", settings: "digest", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(issuer.calls == 1)
            #expect(fetched.origin == .fetchedForFleet)
            #expect(fetched.fetched?.accessToken == "a-token-1")
            #expect(fetched.record.accessToken == "a-token-1")
            #expect(fetched.record.scope == "read")
            #expect(fetched.record.settings == "digest")
            #expect(fetched.record.version >= 1)
            if let expiresAt = fetched.record.expiresAt {
                #expect(abs(expiresAt.timeIntervalSince(fetched.record.issuedAt) - 300) < 0.001)
            } else {
                Issue.record("the record should keep the token's expiry")
            }

            // Sealed in Redis, under the key's hash.
            let stored = try storedRecord(server, "orders")
            #expect(same(stored, fetched.record), "Redis holds \(String(describing: stored))")
            let fence = try server.command("GET", try name("fence:", "orders"))
            #expect(fence == .string(Array("1".utf8)), "one lease taken")
            #expect(try server.bytes(try name("lease:", "orders")) == nil, "the lease is let go once stored")

            // Published: the other broker's watcher has it.
            #expect(await eventually(within: 20) { !received.withLock { $0.isEmpty } })
            #expect(same(received.withLock { $0.first }, fetched.record))
            #expect(received.withLock { $0.count } == 1)
            #expect(otherSettings.withLock { $0 } == 0, "a watcher under other settings is not told")
            #expect(otherKey.withLock { $0 } == 0, "a watcher of another key is not told")
            #expect(store.currentHealth.reachable)

            // No more deliveries once it stops watching.
            watcher.stopWatching("orders", id: id)
            _ = success(
                await store.fetchForFleet(
                    "orders", settings: "digest", current: fetched.record.version, forced: false, fetch: issuer.fetch))
            #expect(issuer.calls == 2)
            #expect(await eventually(within: 20) { (try? storedRecord(server, "orders"))??.accessToken == "a-token-2" })
            try await Task.sleep(for: .milliseconds(200))
            #expect(received.withLock { $0.count } == 1)
        }
    }

    @Test func anotherBrokerHoldingAnOlderVersionGetsTheRecordWithoutFetching() async throws {
        try await withRedis { server, fleet in
            let first = try fleet.store()
            let second = try fleet.store()
            let issuerA = Issuer("a")
            guard
                let fetched = success(
                    await first.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuerA.fetch))
            else { return }
            let version = fetched.record.version

            let issuerB = Issuer("b")
            guard
                let shared = success(
                    await second.fetchForFleet(
                        "orders", settings: "s", current: version - 1, forced: false, fetch: issuerB.fetch))
            else { return }
            #expect(shared.origin == .fromFleet)
            #expect(shared.fetched == nil)
            #expect(same(shared.record, fetched.record))
            #expect(issuerB.calls == 0, "one fetch serves the fleet")

            // Holding that version already, the broker fetches the next one, numbered after it.
            guard
                let next = success(
                    await second.fetchForFleet(
                        "orders", settings: "s", current: version, forced: false, fetch: issuerB.fetch))
            else { return }
            #expect(next.origin == .fetchedForFleet)
            #expect(issuerB.calls == 1)
            #expect(next.record.version > version)
            #expect(next.record.accessToken == "b-token-1")
            #expect(same(try storedRecord(server, "orders"), next.record))

            // A record made under other settings does not answer, and is replaced.
            let issuerC = Issuer("c")
            guard
                let changed = success(
                    await second.fetchForFleet(
                        "orders", settings: "new", current: 0, forced: false, fetch: issuerC.fetch))
            else { return }
            #expect(changed.origin == .fetchedForFleet)
            #expect(issuerC.calls == 1)
            #expect(try storedRecord(server, "orders")?.settings == "new")
        }
    }

    /// A record the provider refuses (its token breaks this broker's rules, `TokenRules`) is
    /// fetched past as an older one is: this broker takes the lease, fetches, and replaces it.
    @Test func aRecordTheProviderRefusesIsFetchedPastAndReplaced() async throws {
        try await withRedis { server, fleet in
            let first = try fleet.store()
            let second = try fleet.store()
            guard
                let fetched = success(
                    await first.fetchForFleet(
                        "orders", settings: "s", current: 0, forced: false, fetch: Issuer("a").fetch))
            else { return }
            let offered = Mutex<[UInt64]>([])
            let issuer = Issuer("b")
            guard
                let refetched = success(
                    await second.fetchForFleet(
                        "orders", settings: "s", current: 0, forced: false,
                        accepts: { record in
                            offered.withLock { $0.append(record.version) }
                            return record.accessToken != fetched.record.accessToken
                        }, fetch: issuer.fetch))
            else { return }
            #expect(offered.withLock { $0 } == [fetched.record.version], "the record was offered once")
            #expect(refetched.origin == .fetchedForFleet)
            #expect(issuer.calls == 1)
            #expect(refetched.record.version > fetched.record.version)
            #expect(same(try storedRecord(server, "orders"), refetched.record))
        }
    }

    @Test func anExpiredRecordDoesNotAnswer() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            // Kept without expiry in Redis, but expired by its own dates.
            let old = StoredToken(
                accessToken: "old", tokenType: "Bearer", scope: nil, version: 9,
                issuedAt: WallTime(timeIntervalSince1970: 1_600_000_000),
                expiresAt: WallTime(timeIntervalSince1970: 1_600_000_100), settings: "s")
            let sealed = try StoreRecord(cipher: AESGCM(key: Self.sealingKey)!).seal(old, key: "orders")
            _ = try server.admin().command([Array("SET".utf8), Array(try name("record:", "orders").utf8), sealed])
            let issuer = Issuer("a")
            guard
                let fetched = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(fetched.origin == .fetchedForFleet)
            #expect(issuer.calls == 1)
            #expect(fetched.record.version >= 10, "numbered after the record it replaces")
        }
    }

    @Test func twoBrokersAskingAtOnceMakeOneFetch() async throws {
        try await withRedis { server, fleet in
            let first = try fleet.store()
            let second = try fleet.store()
            #expect(await awaitSubscribers(server, 2))
            // One issuer for both, held until both have asked: whoever takes the lease fetches.
            let issuer = Issuer("shared", gated: true)
            async let one = first.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch)
            async let two = second.fetchForFleet(
                "orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch)
            #expect(await eventually(within: 20) { issuer.parkedCount == 1 })
            try await Task.sleep(for: .milliseconds(300))
            #expect(issuer.calls == 1, "the other broker waits on the lease")
            issuer.open()
            let results = await [one, two]
            #expect(issuer.calls == 1, "exactly one fetch for the fleet")
            let fetches = results.compactMap { success($0) }
            #expect(fetches.count == 2)
            #expect(Set(fetches.map(\.record.accessToken)) == ["shared-token-1"])
            #expect(fetches.map(\.origin).sorted { "\($0)" < "\($1)" } == [.fetchedForFleet, .fromFleet])
        }
    }

    @Test func aFailedFetchKeepsTheLeaseAndTheOthersWaitForItsHoldersRetry() async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 60_000 }
            let waiting = try fleet.store { $0.leaseMsec = 60_000 }
            #expect(await awaitSubscribers(server, 2))
            let failing = Issuer("a", failures: 1)
            let failed = await holder.fetchForFleet(
                "orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            #expect(failed.failure?.description == "server_error")
            #expect(failing.calls == 1)
            guard case .integer(let left) = try server.command("PTTL", try name("lease:", "orders")) else {
                Issue.record("PTTL should answer a number")
                return
            }
            #expect(left > 0, "the lease is kept for the holder's retries")
            // The holder asking again keeps the lease without extending it: a broker whose own
            // fetches fail holds up the fleet for leaseMsec at most.
            let failingAgain = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet(
                "orders", settings: "s", current: 0, forced: false, fetch: failingAgain.fetch)
            #expect(failingAgain.calls == 1, "its retry fetches under the lease it holds")
            guard case .integer(let leftAfterRetry) = try server.command("PTTL", try name("lease:", "orders")) else {
                Issue.record("PTTL should answer a number")
                return
            }
            #expect(leftAfterRetry <= left, "not extended by the retry")

            let other = Issuer("b")
            let done = Mutex(false)
            let wait = Task {
                defer { done.withLock { $0 = true } }
                return await waiting.fetchForFleet(
                    "orders", settings: "s", current: 0, forced: false, fetch: other.fetch)
            }
            try await Task.sleep(for: .milliseconds(700))
            #expect(!done.withLock { $0 }, "the other broker waits")
            #expect(other.calls == 0)

            // The holder's retry, under its own lease, stores the record the other was waiting for.
            guard
                let retried = success(
                    await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
                )
            else { return }
            #expect(retried.origin == .fetchedForFleet)
            #expect(failing.calls == 2)
            guard let shared = success(await wait.value) else { return }
            #expect(shared.origin == .fromFleet)
            #expect(same(shared.record, retried.record))
            #expect(other.calls == 0, "the waiting broker fetched nothing")
        }
    }

    /// A broker waiting on a live lease waits until its task is cancelled, and fetches nothing.
    /// With a shorter `leaseMsec` than the holder's (a fleet in the middle of changing it) it
    /// waits for the holder too, for its own `leaseMsec` at most
    /// (`aBrokerWaitsOnAnothersLeaseNoLongerThanItsOwnLeaseMsec`): comparing what the lease had
    /// left with its own `leaseMsec`, it once took a live lease over, and both fetched.
    @Test(arguments: [60_000, 5000])
    func aBrokerWaitingOnALiveLeaseFetchesNothingAndGivesUpWhenCancelled(_ waitingLeaseMsec: Int) async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 60_000 }
            let waiting = try fleet.store { $0.leaseMsec = waitingLeaseMsec }
            // A failed fetch keeps the lease, for the holder's retries.
            let failing = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            let other = Issuer("b")
            let wait = Task {
                await waiting.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: other.fetch)
            }
            try await Task.sleep(for: .milliseconds(700))
            wait.cancel()
            #expect(await wait.value.failure?.description == "timeout", "it waited until cancelled")
            #expect(other.calls == 0, "the holder's lease is not taken over")
        }
    }

    @Test func aLeaseWhoseHolderNeverRetriesIsTakenOnceItRunsOut() async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 300 }
            let waiting = try fleet.store { $0.leaseMsec = 300 }
            let failing = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            let other = Issuer("b")
            guard
                let fetched = success(
                    await waiting.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: other.fetch))
            else { return }
            #expect(fetched.origin == .fetchedForFleet)
            #expect(other.calls == 1)
            #expect(fetched.record.version >= 2, "the second lease's fence")
            #expect(try server.command("GET", try name("fence:", "orders")) == .string(Array("2".utf8)))
        }
    }

    /// A lease key no broker of the fleet could have set: one without expiry (set by hand), or
    /// with more left than the longest lease a broker may take (600000 ms). Waited on as a lease,
    /// it held up every broker of the fleet, for good or for as long as it said, while their
    /// tokens expired.
    @Test(arguments: [[], ["PX", "900000"]])
    func aLeaseNoBrokerOfTheFleetCouldHaveTakenIsTakenOver(_ expiry: [String]) async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store { $0.leaseMsec = 1000 }
            let lease = try name("lease:", "orders")
            _ = try server.admin().command((["SET", lease, "someone-else"] + expiry).map { Array($0.utf8) })
            let issuer = Issuer("a")
            let asking = Task {
                await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch)
            }
            // Waiting on the lease, it would wait until cancelled.
            let deadline = Task {
                try? await Task.sleep(for: .seconds(20))
                asking.cancel()
            }
            let result = await asking.value
            deadline.cancel()
            guard let fetched = success(result) else { return }
            #expect(fetched.origin == .fetchedForFleet)
            #expect(issuer.calls == 1)
            #expect(try server.bytes(lease) == nil, "taken over, then let go once the record was stored")
            #expect(try storedRecord(server, "orders")?.accessToken == "a-token-1")
        }
    }

    /// A broker whose lease ran out and was taken over while it fetched cannot overwrite the
    /// newer lease's record: its token is its own (`fetchedAlone`).
    @Test func aWriterWhoseLeaseWasTakenOverCannotOverwrite() async throws {
        try await withRedis { server, fleet in
            let slow = try fleet.store()
            let fast = try fleet.store()
            let slowIssuer = Issuer("slow", gated: true)
            async let late = slow.fetchForFleet(
                "orders", settings: "s", current: 0, forced: false, fetch: slowIssuer.fetch)
            #expect(await eventually(within: 20) { slowIssuer.parkedCount == 1 })

            // The lease runs out (simulated), and another broker takes it.
            #expect(try server.command("DEL", try name("lease:", "orders")) == .integer(1))
            let fastIssuer = Issuer("fast")
            guard
                let taken = success(
                    await fast.fetchForFleet(
                        "orders", settings: "s", current: 0, forced: false, fetch: fastIssuer.fetch))
            else { return }
            #expect(taken.origin == .fetchedForFleet)
            #expect(fastIssuer.calls == 1)

            slowIssuer.open()
            guard let fenced = success(await late) else { return }
            #expect(fenced.origin == .fetchedAlone, "fenced off: not stored for the fleet")
            #expect(fenced.record.accessToken == "slow-token-1", "its token serves this broker all the same")
            #expect(fenced.fetched?.accessToken == "slow-token-1")
            let stored = try storedRecord(server, "orders")
            #expect(stored?.accessToken == "fast-token-1", "Redis keeps the newer lease's record")
            #expect(same(stored, taken.record))
        }
    }

    /// A fence counter outside what the broker hands out (a version is at most 15 digits, as
    /// `/token/refresh` and `/token/ready` read it) is Redis refusing: the broker fetches alone at
    /// once (no wait on a lease of its own, no version from the counter), says why, and reads as
    /// out of reach until a lease is taken again (the counter deleted).
    @Test(arguments: ["-1000000", "999999999999999", "1000000000000000"])
    func aFenceOutOfRangeIsRedisRefusingTheBrokerFetchesAloneAndSaysSoUntilItIsReset(fence: String) async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let store = try fleet.store(events: reports.events)
            #expect(await awaitSubscribers(server, 1))
            try server.command("SET", try name("fence:", "orders"), fence)
            let issuer = Issuer("a")

            // Bounded: a broker that waits on its own lease would never end by itself.
            let fetching = Task {
                await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch)
            }
            let deadline = Task {
                try await Task.sleep(for: .seconds(30))
                fetching.cancel()
            }
            let result = await fetching.value
            deadline.cancel()
            guard let alone = success(result) else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(alone.record.version == 1, "numbered after the token held, not after the counter")
            #expect(issuer.calls == 1)
            #expect(try storedRecord(server, "orders") == nil, "nothing stored for the fleet")
            #expect(try server.bytes(try name("lease:", "orders")) == nil, "no lease held")
            #expect(try server.command("GET", try name("fence:", "orders")) == .string(Array(fence.utf8)))
            let problem = store.currentHealth.problem ?? ""
            let fenceName = try name("fence:", "orders")
            #expect(!store.currentHealth.reachable)
            #expect(problem.contains("fence counter \(fenceName)"), "\(problem)")
            #expect(reports.all == [problem], "reported once, with why")

            // Still refusing a while later (Redis answers its other commands meanwhile), and again.
            try await Task.sleep(for: .milliseconds(1500))
            #expect(!store.currentHealth.reachable, "the refusal is not cleared by a PING")
            guard
                let again = success(
                    await store.fetchForFleet("orders", settings: "s", current: 1, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(again.origin == .fetchedAlone)
            #expect(again.record.version == 2)
            #expect(reports.all.count == 1, "said once")

            // The counter deleted: the broker takes the lease again, and says Redis answers.
            try server.command("DEL", try name("fence:", "orders"))
            guard
                let rejoined = success(
                    await store.fetchForFleet("orders", settings: "s", current: 2, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(rejoined.origin == .fetchedForFleet)
            #expect(rejoined.record.version == 3)
            #expect(await eventually(within: 20) { store.currentHealth.reachable })
            #expect(reports.all.last.map { $0 == nil } == true, "reported reachable again")
        }
    }

    /// One key's refused counter is not cleared by another key's lease: the store stays out of
    /// reach, said once, while any key is refused (it flipped at every refresh of the two).
    @Test func aRefusedFenceCounterIsNotClearedByAnotherKeysLease() async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let store = try fleet.store(events: reports.events)
            #expect(await awaitSubscribers(server, 1))
            try server.command("SET", try name("fence:", "orders"), "-1000000")
            let issuer = Issuer("a")
            guard
                let alone = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(alone.origin == .fetchedAlone)
            guard
                let shared = success(
                    await store.fetchForFleet("billing", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(shared.origin == .fetchedForFleet, "billing's counter is sound: its lease is taken")
            #expect(!store.currentHealth.reachable, "orders is still refused")
            #expect(reports.all.count == 1, "said once, not cleared by billing's lease: \(reports.all)")
            try server.command("DEL", try name("fence:", "orders"))
            guard
                let rejoined = success(
                    await store.fetchForFleet("orders", settings: "s", current: 1, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(rejoined.origin == .fetchedForFleet)
            #expect(await eventually(within: 20) { store.currentHealth.reachable })
        }
    }

    /// A fence counter Lua reads as a number but `INCR` refuses (`1e5`, `+5`, `05`, ` 5`) is out of
    /// range as README says ("not a whole number"): refused before `INCR`, the broker fetches
    /// alone, names the counter's key, and says so once. `INCR`'s error reply named the script's
    /// SHA, dropped the connection and marked Redis out of reach, then the next call reachable:
    /// at every refresh, out of reach and reachable again.
    @Test(arguments: ["1e5", "+5", "05", " 5", "5.0"])
    func aFenceCounterThatIsNoWholeNumberInDigitsIsRefusedAsOutOfRange(fence: String) async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let store = try fleet.store(events: reports.events)
            #expect(await awaitSubscribers(server, 1))
            try server.command("SET", try name("fence:", "orders"), fence)
            let issuer = Issuer("a")
            guard let alone = await fetchedOrders(by: store, current: 0, from: issuer)
            else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(issuer.calls == 1)
            let problem = store.currentHealth.problem ?? ""
            #expect(problem.contains("the fence counter \(try name("fence:", "orders")) is outside"), "\(problem)")
            #expect(!problem.contains("script"), "names the key, not the script: \(problem)")
            try await Task.sleep(for: .milliseconds(1500))
            guard
                let again = success(
                    await store.fetchForFleet("orders", settings: "s", current: 1, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(again.origin == .fetchedAlone)
            #expect(reports.all == [problem], "said once, not out of reach and back at each fetch")
            #expect(try server.command("GET", try name("fence:", "orders")) == .string(Array(fence.utf8)))
        }
    }

    /// A key of the store's of another type than a string (`RPUSH` on the record, the lease or the
    /// fence) is one key Redis refuses: `WRONGTYPE` is Redis's answer about that key, not a broken
    /// connection, so the connection stays, and the broker fetches that provider's tokens alone,
    /// names the key, and says so once until the key is deleted. It dropped the connection and
    /// marked the store out of reach, then reachable at the next call, naming the script's SHA.
    @Test(arguments: ["record:", "lease:", "fence:"])
    func aKeyOfAnotherTypeIsOneKeyRefusedWithoutDroppingTheConnection(kind: String) async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let store = try fleet.store(events: reports.events)
            #expect(await awaitSubscribers(server, 1))
            let issuer = Issuer("a")
            guard
                let billing = success(
                    await store.fetchForFleet("billing", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(billing.origin == .fetchedForFleet)
            let connection = try commandConnections(server)
            #expect(connection.count == 1, "the store's command connection: \(connection)")

            let key = try name(kind, "orders")
            try server.command("RPUSH", key, "x")
            if kind == "record:" {
                guard case .refused(let why) = await store.load("orders") else {
                    Issue.record("a list under the record's key is refused")
                    return
                }
                #expect(why.contains(key), "\(why)")
            }
            guard let alone = await fetchedOrders(by: store, current: 0, from: issuer)
            else { return }
            #expect(alone.origin == .fetchedAlone)
            let problem = store.currentHealth.problem ?? ""
            #expect(problem.contains("the key \(key) holds another type than a string"), "\(problem)")
            #expect(!store.currentHealth.reachable)
            // A second later (the subscriber's probe has had its turn) and at the next fetch: the same.
            try await Task.sleep(for: .milliseconds(1500))
            guard
                let again = success(
                    await store.fetchForFleet("orders", settings: "s", current: 1, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(again.origin == .fetchedAlone)
            #expect(store.currentHealth.problem == problem)
            #expect(reports.all == [problem], "said once: \(reports.all)")
            #expect(try commandConnections(server) == connection, "the connection was kept")
            #expect(try server.command("TYPE", key) == .status("list"), "the key is left as it is")
            // billing's lease is still taken meanwhile.
            guard
                let shared = success(
                    await store.fetchForFleet("billing", settings: "s", current: 1, forced: true, fetch: issuer.fetch))
            else { return }
            #expect(shared.origin == .fetchedForFleet)

            try server.command("DEL", key)
            guard
                let rejoined = success(
                    await store.fetchForFleet("orders", settings: "s", current: 2, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(rejoined.origin == .fetchedForFleet)
            #expect(await eventually(within: 20) { store.currentHealth.reachable })
            #expect(store.currentHealth.problem == nil)
        }
    }

    // MARK: - A lease that holds the broker up

    /// A lease no broker with this `leaseMsec` could have taken (`SET … PX 600000`, the longest a
    /// fleet's broker may take, by hand), while the provider's token has 2 s left: the broker waits
    /// for half of that at most, then fetches alone (it does not let its token expire), leaves the
    /// lease as it is, and reads as degraded, naming the lease's key, never its holder, until a
    /// lease is taken again. It waited until its fetch was given up, and again, for ten minutes.
    @Test func aLeaseThatOutlivesAnyThisBrokerTakesLetsItFetchAloneBeforeItsTokenExpires() async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let held = Leases()
            var events = reports.events
            events.lease = held.events.lease
            let store = try fleet.store(events: events) { $0.leaseMsec = 10_000 }
            #expect(await awaitSubscribers(server, 1))
            let lease = try name("lease:", "orders")
            try server.command("SET", lease, "someone-else", "PX", "600000")
            let issuer = Issuer("a")
            let waiting = FleetWait(tokenLeft: .seconds(2), fetchLeft: .seconds(15))
            guard let alone = await fetchedOrders(by: store, current: 1, waiting: waiting, from: issuer)
            else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(alone.record.version == 2)
            #expect(issuer.calls == 1)
            #expect(try server.bytes(lease) == Array("someone-else".utf8), "the lease is left as it is")
            #expect(try storedRecord(server, "orders") == nil)
            let health = store.currentHealth
            let problem = health.problem ?? ""
            #expect(health.reachable, "Redis answers: the store is not out of reach")
            #expect(problem.contains("the lease \(lease)") && problem.contains("outlives"), "\(problem)")
            #expect(!problem.contains("someone-else"))
            #expect(held.all == [problem])
            #expect(reports.all.isEmpty)

            guard let again = await fetchedOrders(by: store, current: 2, waiting: waiting, from: issuer)
            else { return }
            #expect(again.origin == .fetchedAlone)
            #expect(held.all == [problem], "said once")

            try server.command("DEL", lease)
            guard
                let rejoined = success(
                    await store.fetchForFleet(
                        "orders", settings: "s", current: 3, forced: false, waiting: waiting, accepts: { _ in true },
                        fetch: issuer.fetch))
            else { return }
            #expect(rejoined.origin == .fetchedForFleet)
            #expect(store.currentHealth.problem == nil)
            #expect(held.all == [problem, nil], "said when it ended")
        }
    }

    /// A broker with a shorter `leaseMsec` than the holder's (500 ms against 60000: a fleet in
    /// the middle of changing it), without a token, waits for the holder's lease for its own
    /// `leaseMsec` at most, then fetches alone, leaving the holder's lease as it is; once more at
    /// once while that lease lasts. It waited for the holder's lease until it was cancelled.
    @Test func aBrokerWaitsOnAnothersLeaseNoLongerThanItsOwnLeaseMsec() async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 60_000 }
            let held = Leases()
            let waiting = try fleet.store(events: held.events) { $0.leaseMsec = 500 }
            #expect(await awaitSubscribers(server, 2))
            let failing = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            let lease = try server.bytes(try name("lease:", "orders"))
            #expect(lease != nil, "the holder keeps its lease for its retries")
            let other = Issuer("b")
            guard let alone = await fetchedOrders(by: waiting, current: 0, from: other)
            else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(other.calls == 1)
            #expect(try server.bytes(try name("lease:", "orders")) == lease, "the holder's lease is not taken over")
            #expect(held.all.count == 1 && held.all.first??.contains("outlives") == true, "\(held.all)")
            guard let again = await fetchedOrders(by: waiting, current: 1, from: other)
            else { return }
            #expect(again.origin == .fetchedAlone)
            #expect(other.calls == 2)
        }
    }

    /// A fleet broker whose issuer fails takes its lease again each time the last lapses: each is
    /// another lease, waited on for this broker's `leaseMsec` afresh, so that a failing issuer
    /// still sees one broker's retries. The wait was counted from the holder's first lease, so
    /// the second looked like one that outlived this broker's `leaseMsec`: the broker fetched
    /// alone and said a lease it did not take held up the fleet (review 7, F1).
    @Test func aLeaseItsHolderTakesAgainAfterTheLastLapsedIsWaitedOnAfresh() async throws {
        try await withRedis { server, fleet in
            let held = Leases()
            let waiting = try fleet.store(events: held.events) { $0.leaseMsec = 2000 }
            #expect(await awaitSubscribers(server, 1))
            let lease = try name("lease:", "orders")
            try server.command("SET", lease, "a-fleet-broker", "PX", "1500")
            let issuer = Issuer("b")
            let fetching = Task {
                await waiting.fetchForFleet(
                    "orders", settings: "s", current: 0, forced: false,
                    waiting: FleetWait(tokenLeft: .seconds(60), fetchLeft: .seconds(15)), accepts: { _ in true },
                    fetch: issuer.fetch)
            }
            // The holder's retry failed, its lease lapsed, and it took the lease again at once.
            try await Task.sleep(for: .milliseconds(800))
            try server.command("DEL", lease)
            try server.command("SET", lease, "a-fleet-broker", "PX", "1800")
            guard let fetched = success(await bounded { await fetching.value }) else { return }
            #expect(fetched.origin == .fetchedForFleet, "waited for the second lease to lapse, then took it")
            #expect(issuer.calls == 1)
            #expect(held.all.isEmpty, "\(held.all)")
            #expect(waiting.currentHealth.problem == nil)
        }
    }

    /// A lease that ends within this broker's own `leaseMsec` (the fleet's, its holder's fetches
    /// failing) is waited on as README says, however little the provider's token has left: the
    /// others do not each fetch from a failing issuer. Once it lapses, this broker takes it.
    @Test func aLeaseWithinThisBrokersLeaseMsecIsWaitedOnHoweverLittleItsTokenHasLeft() async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 1500 }
            let held = Leases()
            let waiting = try fleet.store(events: held.events) { $0.leaseMsec = 1500 }
            #expect(await awaitSubscribers(server, 2))
            let failing = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            let other = Issuer("b")
            guard
                let fetched = await fetchedOrders(
                    by: waiting, current: 1, waiting: FleetWait(tokenLeft: .milliseconds(100), fetchLeft: .seconds(15)),
                    from: other)
            else { return }
            #expect(fetched.origin == .fetchedForFleet, "the lease lapsed, and this broker took it")
            #expect(other.calls == 1)
            #expect(held.all.isEmpty)
            #expect(waiting.currentHealth.problem == nil)
        }
    }

    /// A broker waiting on a live lease as its fetch's deadline nears gives up waiting with a
    /// failure that says what it waited for, rather than let the provider abandon a fetch that
    /// never reached the source ("the source did not finish").
    @Test func aWaitOnALeaseEndsBeforeTheFetchsDeadlineAndSaysSo() async throws {
        try await withRedis { server, fleet in
            let holder = try fleet.store { $0.leaseMsec = 60_000 }
            let waiting = try fleet.store { $0.leaseMsec = 60_000 }
            let failing = Issuer("a", failures: 1)
            _ = await holder.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: failing.fetch)
            let other = Issuer("b")
            let result = await bounded {
                await waiting.fetchForFleet(
                    "orders", settings: "s", current: 0, forced: false, waiting: FleetWait(fetchLeft: .seconds(1)),
                    accepts: { _ in true }, fetch: other.fetch)
            }
            guard case .failure(let error) = result else {
                Issue.record("the wait should fail: \(result)")
                return
            }
            #expect(error.description == "timeout")
            #expect(error.detail.contains("for the lease \(try name("lease:", "orders")), which another broker holds"))
            #expect(other.calls == 0)
            #expect(waiting.currentHealth.problem == nil, "a lease of the fleet's, within this broker's leaseMsec")
        }
    }

    /// A record of a token without expiry lives a day in Redis, renewed at each write, so that a
    /// record no broker writes again (a dropped child's) does not stay for good.
    @Test func aRecordOfATokenWithoutExpiryLivesADayRenewedAtEachWrite() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let issuer = Issuer("a", lifetime: nil)
            guard
                let fetched = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(fetched.origin == .fetchedForFleet)
            #expect(fetched.record.expiresAt == nil)
            let day: Int64 = 86_400_000
            guard case .integer(let left) = try server.command("PTTL", try name("record:", "orders")) else {
                Issue.record("PTTL should answer a number")
                return
            }
            #expect(left > day - 60_000 && left <= day, "a fetched record lives a day: \(left) ms")

            var token = Self.token(version: 7)
            token.expiresAt = nil
            store.save("billing", token)
            #expect(await eventually(within: 20) { (try? server.bytes(try name("record:", "billing"))) != nil })
            guard case .integer(let saved) = try server.command("PTTL", try name("record:", "billing")) else {
                Issue.record("PTTL should answer a number")
                return
            }
            #expect(saved > day - 60_000 && saved <= day, "a saved record lives a day: \(saved) ms")
            #expect(await store.load("billing") == .found(token))
        }
    }

    /// A record too large to be read back is not written, and the store says so (the broker logs
    /// and counts it).
    @Test func aRecordTooLargeToReadBackIsNotWrittenAndIsReported() async throws {
        try await withRedis { server, fleet in
            let reports = Mutex<[(String, String)]>([])
            let operations = Mutex<[String]>([])
            var events = RedisTokenStore.Events()
            events.notStored = { key, problem in reports.withLock { $0.append((key, problem)) } }
            events.operation = { operation, result in operations.withLock { $0.append("\(operation) \(result)") } }
            let store = try fleet.store(events: events)
            var token = Self.token(version: 2)
            token.scope = String(repeating: "s", count: StoreRecord.maximumSize)
            store.save("orders", token)
            #expect(await eventually(within: 20) { !reports.withLock { $0.isEmpty } })
            let report = reports.withLock { $0.first }
            #expect(report?.0 == "orders")
            #expect(report?.1.contains("larger than") == true, "\(String(describing: report))")
            #expect(report?.1.contains(Self.secret) == false)
            #expect(operations.withLock { $0 } == ["write error"])
            #expect(try server.bytes(try name("record:", "orders")) == nil)
        }
    }

    // MARK: - Out of reach

    @Test func withRedisGoneTheBrokerFetchesAloneAndRejoinsWhenItIsBack() async throws {
        try await withRedis { server, fleet in
            let reports = Reachability()
            let store = try fleet.store(events: reports.events)
            let issuer = Issuer("a")
            guard
                let first = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(first.origin == .fetchedForFleet)
            #expect(store.currentHealth.reachable)

            server.kill()
            guard
                let alone = success(
                    await store.fetchForFleet(
                        "orders", settings: "s", current: first.record.version, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(issuer.calls == 2, "fetched here, as without a store")
            #expect(alone.record.version == first.record.version + 1, "numbered after the token held")
            #expect(alone.record.accessToken == "a-token-2")
            let health = store.currentHealth
            #expect(!health.reachable)
            #expect(health.problem != nil)
            #expect(health.lastReachable != nil, "it answered before")
            #expect(reports.all.count == 1)
            #expect(reports.all.first.map { $0 != nil } == true, "reported out of reach, with why")
            if case .refused(let reason) = await store.load("orders") {
                #expect(reason.contains("out of reach"))
            } else {
                Issue.record("a load without Redis should be refused")
            }

            try await server.start()
            // Redis is tried again at most once a second: the fetches go alone until it answers.
            var rejoined: SharedFetch?
            let end = ContinuousClock.now.advanced(by: .seconds(20))
            while ContinuousClock.now < end {
                guard
                    let result = success(
                        await store.fetchForFleet(
                            "orders", settings: "s", current: 100, forced: false, fetch: issuer.fetch))
                else { return }
                if result.origin == .fetchedForFleet {
                    rejoined = result
                    break
                }
                #expect(result.origin == .fetchedAlone)
                try await Task.sleep(for: .milliseconds(250))
            }
            #expect(rejoined != nil, "the store should rejoin the fleet once Redis answers")
            // Reachable once both connections answer: the subscriber reconnects within a second or so.
            #expect(await eventually(within: 20) { store.currentHealth.reachable })
            #expect(store.currentHealth.problem == nil)
            #expect(reports.all.last.map { $0 == nil } == true, "reported reachable again")
            #expect(same(try storedRecord(server, "orders"), rejoined?.record))
        }
    }

    @Test func aStoreStartedWithoutRedisFetchesAlone() async throws {
        try await withRedis { server, fleet in
            server.kill()
            let store = try fleet.store()
            let issuer = Issuer("a")
            guard
                let alone = success(
                    await store.fetchForFleet("orders", settings: "s", current: 4, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(alone.origin == .fetchedAlone)
            #expect(alone.record.version == 5)
            #expect(!store.currentHealth.reachable)
            #expect(store.currentHealth.lastReachable == nil, "it never answered")

            // A failing issuer fails alone too.
            let failing = Issuer("b", failures: 5)
            let failed = await store.fetchForFleet(
                "orders", settings: "s", current: 4, forced: false, fetch: failing.fetch)
            #expect(failed.failure?.description == "server_error")
        }
    }

    // MARK: - Credentials and database

    @Test func theRightPasswordConnectsAndAWrongOneIsRefusedWithoutBeingQuoted() async throws {
        try await withRedis(password: "admin-pass-7731") { server, fleet in
            #expect(
                try server.command("ACL", "SETUSER", "broker", "on", ">broker-pass-5519", "~*", "&*", "+@all")
                    == .status("OK"))

            let issuer = Issuer("a")
            let byPassword = try fleet.store()
            let fetched = success(
                await byPassword.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            #expect(fetched?.origin == .fetchedForFleet)
            #expect(byPassword.currentHealth.reachable)

            let asUser = try fleet.store(password: "broker-pass-5519") { $0.username = "broker" }
            guard case .found(let found) = await asUser.load("orders") else {
                Issue.record("the ACL user should read the record")
                return
            }
            #expect(same(found, fetched?.record))
            let next = success(
                await asUser.fetchForFleet(
                    "orders", settings: "s", current: found.version, forced: false, fetch: issuer.fetch))
            #expect(next?.origin == .fetchedForFleet)

            for (username, password) in [
                (nil, "wrong-pass-8842"), ("broker", "wrong-pass-8842"), ("nobody", "broker-pass-5519"),
            ] {
                let refused = try fleet.store(password: password) { $0.username = username }
                let alone = success(
                    await refused.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch)
                )
                #expect(alone?.origin == .fetchedAlone)
                let health = refused.currentHealth
                #expect(!health.reachable)
                let problem = health.problem ?? ""
                #expect(problem.contains("refused the credentials"), "\(problem)")
                #expect(!problem.contains(password), "the problem quotes the password")
                guard case .refused(let reason) = await refused.load("orders") else {
                    Issue.record("a load with wrong credentials should be refused")
                    continue
                }
                #expect(!reason.contains(password), "the reason quotes the password")
            }

            // Without a password Redis answers every command with NOAUTH: fetched alone all the same.
            let reports = Reachability()
            let anonymous = try fleet.store(password: .some(nil), events: reports.events)
            let alone = success(
                await anonymous.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            #expect(alone?.origin == .fetchedAlone)
            #expect(!anonymous.currentHealth.reachable)
            #expect(anonymous.currentHealth.problem?.contains("NOAUTH") == true)
            guard case .refused(let reason) = await anonymous.load("orders") else {
                Issue.record("a load refused by Redis should be refused")
                return
            }
            #expect(reason.contains("NOAUTH"))
            let again = success(
                await anonymous.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            #expect(again?.origin == .fetchedAlone)
            _ = await anonymous.load("orders")
            // Redis refuses everything this store sends: it stays out of reach, reported once.
            #expect(!anonymous.currentHealth.reachable, "reachable after a GET answered NOAUTH")
            #expect(reports.all.count == 1, "reachability reports: \(reports.all)")
        }
    }

    @Test func theRecordsLandInTheSelectedDatabase() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store { $0.database = 3 }
            let reader = try fleet.store { $0.database = 3 }
            let elsewhere = try fleet.store()
            let issuer = Issuer("a")
            guard
                let fetched = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(fetched.origin == .fetchedForFleet)
            #expect(same(try storedRecord(server, "orders", database: 3), fetched.record))
            #expect(try server.command("DBSIZE", database: 0) == .integer(0), "nothing in database 0")
            #expect(try server.command("EXISTS", try name("fence:", "orders"), database: 3) == .integer(1))
            guard case .found = await reader.load("orders") else {
                Issue.record("a store on database 3 should read it")
                return
            }
            #expect(await elsewhere.load("orders") == .missing, "a store on database 0 has nothing")

            // A database the server does not have: refused, and the broker fetches alone.
            let missing = try fleet.store { $0.database = 10_000 }
            let alone = success(
                await missing.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            #expect(alone?.origin == .fetchedAlone)
            #expect(missing.currentHealth.problem?.contains("SELECT 10000") == true)
        }
    }

    @Test func theKeyPrefixNamesEveryKeyAndTheChannel() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store { $0.keyPrefix = "tb{prod}:" }
            let watcher = try fleet.store { $0.keyPrefix = "tb{prod}:" }
            let received = Mutex(0)
            _ = watcher.watch("orders", settings: "s") { _, _ in received.withLock { $0 += 1 } }
            #expect(await awaitSubscribers(server, 2, channel: "tb{prod}:records"))
            let issuer = Issuer("a")
            guard
                let fetched = success(
                    await store.fetchForFleet("orders", settings: "s", current: 0, forced: false, fetch: issuer.fetch))
            else { return }
            #expect(same(try storedRecord(server, "orders", prefix: "tb{prod}:"), fetched.record))
            #expect(try server.bytes(try name("record:", "orders")) == nil, "nothing under the default prefix")
            #expect(await eventually(within: 20) { received.withLock { $0 } == 1 })
        }
    }

    // MARK: - With a provider

    /// A provider whose refresh through the fleet brings back the token it holds (an issuer that
    /// hands out its current token until it nears expiry) has renewed it, and waits for its next
    /// refresh; the record keeps the token's version (3). (Once, the record took a new version (4)
    /// and the renewal's refresh was planned from the token's first issue: due at once, and Redis
    /// answered it at once with the same token from the fleet, again and again.)
    @Test func aProviderRenewingItsTokenThroughRedisWaitsForItsNextRefresh() async throws {
        try await withRedis { server, fleet in
            let store = try fleet.store()
            let now = WallTime(timeIntervalSince1970: WallTime().timeIntervalSince1970.rounded(.down))
            let held = StoredToken(
                accessToken: "same-token", tokenType: "Bearer", scope: nil, version: 3,
                issuedAt: now.addingTimeInterval(-80),
                expiresAt: now.addingTimeInterval(20), settings: "s")
            store.save("orders", held)
            #expect(await eventually(within: 20) { (try? server.bytes(try name("record:", "orders"))) != nil })

            let source = CurrentTokenIssuer(expiresAt: held.expiresAt!)
            let fromFleet = Mutex(0)
            let origins = Mutex<[SharedFetch.Origin]>([])
            let provider = TokenProvider(
                configuration: ProviderConfiguration(name: "orders", tokenRefreshDelaySec: 300), source: source,
                clock: ManualClock(), jitter: .fixed(0.5),
                events: ProviderEvents(
                    fromFleet: { _, _ in fromFleet.withLock { $0 += 1 } },
                    fetchedFor: { _, origin in origins.withLock { $0.append(origin) } }),
                store: StoreSlot(store: store, key: "orders", settings: "s"))
            let service = Task { await provider.run() }
            // The record is served, and its refresh (80 % of 100 s after its issue) is due: one fetch.
            #expect(await eventually(within: 20) { origins.withLock { $0 } == [.fetchedForFleet] })
            #expect(source.calls == 1)
            // The clock stands still: nothing is due before it moves.
            _ = await eventually(within: 5) { fromFleet.withLock { $0 } >= 10 }
            let answeredFromTheFleet = fromFleet.withLock { $0 }
            provider.shutDown()
            await service.value

            #expect(source.calls == 1, "the issuer is asked once")
            #expect(try storedRecord(server, "orders")?.version == 3, "the same token keeps the stored version")
            #expect(answeredFromTheFleet == 0, "fetches answered from the fleet at the same instant")
        }
    }
}
