import Foundation
import Glibc
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerTestSupport

@testable import TokenBrokerStore

/// A Redis of the test's own, on a Unix socket in a private temporary folder: it reads each
/// command (a RESP array of bulk strings), notes its name, and answers as `answer` says for that
/// name, a step at a time. What no real Redis does, and a broken or hostile one may: a reply a
/// byte at a time, a reply larger than any record, an answer the scripts never give.
private final class ScriptedRedis: @unchecked Sendable {
    enum Step {
        case send([UInt8])
        case pause(milliseconds: Int)
    }

    let folder: TemporaryDirectory
    let socket: String
    private let listener: Int32
    private let answer: @Sendable (String) -> [Step]
    private let names = Mutex<[String]>([])
    private let stopped = Atomic<Bool>(false)

    /// - Parameter answer: the steps that answer a command, by its name in capitals.
    init(answer: @escaping @Sendable (String) -> [Step]) throws {
        // A write to a connection the store closed must fail with EPIPE, not end the test process.
        signal(SIGPIPE, SIG_IGN)
        folder = try TemporaryDirectory()
        socket = folder.path("fake.sock")
        self.answer = answer
        listener = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            for (index, byte) in socket.utf8.prefix(path.count - 1).enumerated() { path[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0, listen(listener, 16) == 0 else {
            close(listener)
            throw POSIXError(.init(rawValue: errno) ?? .EIO)
        }
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// The names of the commands received so far, in order.
    var received: [String] { names.withLock { $0 } }

    /// Stops accepting and answering; the threads end within a tenth of a second.
    func stop() {
        stopped.store(true, ordering: .relaxed)
    }

    deinit {
        stop()
        close(listener)
    }

    private func acceptLoop() {
        while !stopped.load(ordering: .relaxed) {
            var descriptor = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) > 0 else { continue }
            let client = accept(listener, nil, nil)
            guard client >= 0 else { continue }
            Thread.detachNewThread { [self] in serve(client) }
        }
    }

    private func serve(_ client: Int32) {
        defer { close(client) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !stopped.load(ordering: .relaxed) {
            while let (name, used) = Self.command(in: buffer) {
                buffer.removeFirst(used)
                names.withLock { $0.append(name) }
                for step in answer(name) {
                    guard !stopped.load(ordering: .relaxed) else { return }
                    switch step {
                    case .send(let bytes):
                        guard bytes.withUnsafeBytes({ send(client, $0.baseAddress, $0.count, 0) }) == bytes.count
                        else { return }
                    case .pause(let milliseconds):
                        usleep(UInt32(milliseconds) * 1000)
                    }
                }
            }
            var descriptor = pollfd(fd: client, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) > 0 else { continue }
            let count = recv(client, &chunk, chunk.count, 0)
            guard count > 0 else { return }
            buffer += chunk[..<count]
        }
    }

    /// The first whole command in `bytes`, a RESP array of bulk strings: its name in capitals
    /// and how many bytes it took; nil until one has come whole.
    private static func command(in bytes: [UInt8]) -> (String, Int)? {
        var position = 0
        func line() -> String? {
            guard let end = bytes[position...].firstIndex(of: UInt8(ascii: "\r")), end + 1 < bytes.count else {
                return nil
            }
            defer { position = end + 2 }
            return String(decoding: bytes[position..<end], as: UTF8.self)
        }
        guard let header = line(), header.first == "*", let count = Int(header.dropFirst()), count > 0 else {
            return nil
        }
        var name = ""
        for index in 0..<count {
            guard let length = line().flatMap({ Int($0.dropFirst()) }), position + length + 2 <= bytes.count else {
                return nil
            }
            if index == 0 { name = String(decoding: bytes[position..<position + length], as: UTF8.self).uppercased() }
            position += length + 2
        }
        return (name, position)
    }
}

/// The `redis` store against a Redis that misbehaves: every call ends within `timeoutMsec`
/// however its reply comes, no reply is read past what a record can be, and an answer of the
/// lease script that sends the store round again is not asked for in a busy loop.
@Suite struct RedisHostileServerTests {
    private static let sealingKey = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 5 &+ 1) }

    /// Redis's confirmation of `SUBSCRIBE token-broker:records`.
    private static let confirmation = Array("*3\r\n$9\r\nsubscribe\r\n$20\r\ntoken-broker:records\r\n:1\r\n".utf8)

    /// Stops `store` on a thread of Dispatch's: `stop()` waits for the store's subscriber.
    private func stopping(_ store: RedisTokenStore) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                store.stop()
                continuation.resume()
            }
        }
    }

    private func settings(_ server: ScriptedRedis, timeoutMsec: Int) -> RedisStoreSettings {
        var settings = RedisStoreSettings(address: .unix(server.socket), keyFile: "/unused")
        settings.timeoutMsec = timeoutMsec
        return settings
    }

    /// Each byte of the reply comes well within the timeout, the whole of it well after: hiredis's
    /// own timeout, which bounds each read, never fires, and the call once lasted as long as the
    /// reply did (for a store, the whole broker's refreshes behind it, and its stop).
    @Test func aReplyTricklingInAByteAtATimeEndsTheCallAtItsTimeout() throws {
        let server = try ScriptedRedis { _ in
            [.send(Array("$40\r\n".utf8))]
                + Array(repeating: [.pause(milliseconds: 50), .send([UInt8(ascii: "x")])], count: 40)
                .flatMap { $0 } + [.send(Array("\r\n".utf8))]
        }
        defer { server.stop() }
        let connection = try RedisConnection.connect(settings(server, timeoutMsec: 300), password: nil)
        #expect {
            try connection.command([Array("GET".utf8), Array("k".utf8)])
        } throws: { error in
            "\(error)" == "Redis did not answer within 300 ms"
        }
    }

    /// `timeoutMsec` is the longest one call may take, connecting included: each step once had a
    /// `timeoutMsec` of its own, so a call that had to connect and authenticate took up to three
    /// (four with `SELECT`), and a broker's stop waited that long (the fourth review: 10.5 s
    /// with 4 s).
    @Test func connectingAuthenticatingAndTheCommandShareOneTimeout() async throws {
        let server = try ScriptedRedis { name in
            switch name {
            case "AUTH": [.pause(milliseconds: 250), .send(Array("+OK\r\n".utf8))]
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            case "GETRANGE": [.pause(milliseconds: 250), .send(Array("$0\r\n\r\n".utf8))]
            case "SUBSCRIBE": [.send(Self.confirmation)]
            default: [.send(Array("+OK\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 400), password: "secret", cipher: AESGCM(key: Self.sealingKey)!)
        // Each step answers within 400 ms; the two take 500 at least.
        let load = await store.load("orders")
        #expect(load == .refused("the Redis store is out of reach: Redis did not answer within 400 ms"), "\(load)")
        await stopping(store)
    }

    /// A record is read with its value first, then its key's time to live: a key gone between the
    /// two (`PTTL` -2) expired just after its value was read, and is not served, whatever the
    /// record's own dates say (they are its writer's clock's).
    @Test func aRecordWhoseKeyIsGoneWhenItsTimeIsAskedHasExpired() async throws {
        let now = WallTime()
        let written = StoredToken(
            accessToken: "ahead", tokenType: "Bearer", scope: nil, version: 2, issuedAt: now.addingTimeInterval(40),
            expiresAt: now.addingTimeInterval(100), settings: "s")
        let sealed = try StoreRecord(cipher: AESGCM(key: Self.sealingKey)!).seal(written, key: "orders")
        let value = Array("$\(sealed.count)\r\n".utf8) + sealed + Array("\r\n".utf8)
        let server = try ScriptedRedis { name in
            switch name {
            case "SUBSCRIBE": [.send(Self.confirmation)]
            case "GETRANGE": [.send(value)]
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            default: [.send(Array("+OK\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 2000), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        guard case .found(let found) = await store.load("orders") else {
            Issue.record("the record should be found")
            return
        }
        #expect(!found.isValid(at: WallTime()), "served until \(String(describing: found.expiresAt))")
        #expect(Array(server.received.filter { $0 == "GETRANGE" || $0 == "PTTL" }.prefix(2)) == ["GETRANGE", "PTTL"])
        await stopping(store)
    }

    /// A bulk string larger than any record, sent at once: not read past `replyLimit`.
    @Test func aBulkStringLargerThanAnyRecordIsNotReadWhole() throws {
        let reply = Array("$400000\r\n".utf8) + [UInt8](repeating: 0x41, count: 400_000) + Array("\r\n".utf8)
        let server = try ScriptedRedis { _ in [.send(reply)] }
        defer { server.stop() }
        let connection = try RedisConnection.connect(settings(server, timeoutMsec: 5000), password: nil)
        #expect {
            try connection.command([Array("GET".utf8), Array("k".utf8)])
        } throws: { error in
            "\(error)" == "Redis sent more than \(RedisConnection.replyLimit) bytes for one reply"
        }
    }

    /// Replies no command of the store's gets back are refused as soon as the reader sees them.
    /// hiredis 0.14 makes an array's table of elements when it reads the array's head: the 13
    /// bytes `*2147483647\r\n` cost 16 GB of address space, and the reply's free walked 2^31
    /// pointers, some 16 s of CPU a call (the fourth review: tokens blocked, the stop 7 s). A
    /// string longer than any message is refused once read (it is within `replyLimit`), an array
    /// inside an array at its head (hiredis's own limit was seven deep).
    @Test(arguments: [
        ("*2147483647\r\n", "an array of more than 3 elements"),
        ("*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n", "an array of more than 3 elements"),
        ("*1\r\n*1\r\n:1\r\n", "an array inside an array"),
        ("*2\r\n:1\r\n" + String(repeating: "*1\r\n", count: 9) + ":1\r\n", "an array inside an array"),
        ("$300000\r\n" + String(repeating: "A", count: 300_000) + "\r\n", "a string longer than 262241 bytes"),
        ("+" + String(repeating: "A", count: 300_000) + "\r\n", "a string longer than 262241 bytes"),
    ])
    func aReplyNoCommandOfTheStoresGetsBackIsRefusedAtOnce(_ reply: String, _ refused: String) throws {
        let server = try ScriptedRedis { _ in [.send(Array(reply.utf8))] }
        defer { server.stop() }
        // Answered at once: a refusal, not a wait for the array's elements until the timeout.
        let connection = try RedisConnection.connect(settings(server, timeoutMsec: 2000), password: nil)
        #expect {
            try connection.command([Array("GET".utf8), Array("k".utf8)])
        } throws: { error in
            "\(error)" == "Redis sent \(refused), which no command of the store's gets back"
        }
    }

    /// The replies the store does get back pass the reader's limits: a message on the channel with
    /// a record of the largest size, and the subscription's confirmation.
    @Test func theLargestMessageOnTheChannelPassesTheReadersLimits() throws {
        let payload = String(repeating: "m", count: RedisConnection.longestString)
        let message = "*3\r\n$7\r\nmessage\r\n$20\r\ntoken-broker:records\r\n$\(payload.utf8.count)\r\n\(payload)\r\n"
        let server = try ScriptedRedis { _ in [.send(Self.confirmation), .send(Array(message.utf8))] }
        defer { server.stop() }
        let connection = try RedisConnection.connect(settings(server, timeoutMsec: 30_000), password: nil)
        #expect(try connection.command([Array("SUBSCRIBE".utf8)]) != .null)
        var received: RedisConnection.Reply?
        for _ in 0..<100 where received == nil {
            received = try connection.bufferedReply()
            if received == nil { _ = try connection.read(waitingAtMost: 100) }
        }
        guard case .array(let parts)? = received, parts.count == 3, case .string(let bytes) = parts[2] else {
            Issue.record("no message: \(String(describing: received))")
            return
        }
        #expect(bytes.count == RedisConnection.longestString)
    }

    /// A store whose Redis answers the array's head: every call is refused at once, the store is
    /// out of reach, and a fetch goes to the issuer alone.
    @Test func aStoreWhoseRedisAnswersAHugeArrayFetchesAlone() async throws {
        let server = try ScriptedRedis { name in
            name == "SUBSCRIBE" ? [.send(Self.confirmation)] : [.send(Array("*2147483647\r\n".utf8))]
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 2000), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        let load = await store.load("orders")
        #expect(
            load
                == .refused(
                    "the Redis store is out of reach: Redis sent an array of more than 3 elements, which no command of "
                        + "the store's gets back"), "\(load)")
        let fetched = await store.fetchForFleet("orders", settings: "s", current: 0, forced: false) {
            () async throws(TokenFetchError) -> FetchedToken in
            FetchedToken(accessToken: "t", lifetime: .seconds(300))
        }
        #expect((try? fetched.get())?.origin == .fetchedAlone)
        #expect(store.currentHealth.reachable == false)
        await stopping(store)
    }

    /// A Redis that answers each call within `timeoutMsec`, but slower than the broker asks: each
    /// call's time counts its wait for its turn. Six loads at once, each reply 300 ms, 500 ms each:
    /// the first is answered, the second runs out of time on the wire, and the others are answered
    /// at their deadline without reaching Redis; the store is out of reach (slow), for a second
    /// every call is answered at once, then Redis answering in time makes it reachable again. The
    /// six once all ran, one after the other, each waiting for those before it (1.8 s here; with
    /// forty providers, no token for minutes).
    @Test func callsWaitingBehindASlowRedisAreAnsweredAtTheirDeadlineWithoutReachingIt() async throws {
        let slow = Atomic<Bool>(true)
        let server = try ScriptedRedis { name in
            switch name {
            case "SUBSCRIBE": [.send(Self.confirmation)]
            case "GETRANGE":
                (slow.load(ordering: .relaxed) ? [.pause(milliseconds: 300)] : []) + [.send(Array("$0\r\n\r\n".utf8))]
            // The record's time to live, read in the same call: none, for a missing key.
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            default: [.send(Array("+PONG\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 500), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        let loads = await withTaskGroup(of: StoreLoad.self) { group in
            for _ in 0..<6 { group.addTask { await store.load("orders") } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(loads.filter { $0 == .missing }.count == 1, "\(loads)")
        #expect(server.received.filter { $0 == "GETRANGE" }.count <= 2, "\(server.received)")
        let late = loads.filter {
            if case .refused(let reason) = $0 { reason.contains("Redis did not answer within 500 ms") } else { false }
        }
        #expect(late.count >= 4, "\(loads)")
        #expect(store.currentHealth.reachable == false)
        #expect(store.currentHealth.problem?.contains("did not answer within 500 ms") == true)
        // Within the second that follows, a call is answered at once, without Redis.
        let asked = server.received.count
        if case .refused = await store.load("orders") {} else { Issue.record("a call within the quiet second") }
        #expect(server.received.count == asked)
        // Then Redis answers in time again, and the store is reachable.
        slow.store(false, ordering: .relaxed)
        #expect(
            await eventually(within: 20) {
                store.currentHealth.reachable
            })
        #expect(await store.load("orders") == .missing)
        await stopping(store)
    }

    /// A fetch given up (its task cancelled, at the provider's fetch deadline) takes its waiting
    /// call off the queue: answered at once, it never reaches Redis, and nothing is fetched. Such
    /// calls once ran for nobody, and the fetches after them waited behind them.
    @Test func aFetchGivenUpTakesItsWaitingCallOffTheQueue() async throws {
        let server = try ScriptedRedis { name in
            switch name {
            case "SUBSCRIBE": [.send(Self.confirmation)]
            case "GETRANGE": [.pause(milliseconds: 1500), .send(Array("$0\r\n\r\n".utf8))]
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            default: [.send(Array("+OK\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 20_000), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        let first = Task { await store.load("orders") }
        #expect(await eventually(within: 20) { server.received.contains("GETRANGE") })
        let fetched = Atomic<Int>(0)
        let givenUp = Task {
            await store.fetchForFleet("orders", settings: "s", current: 0, forced: false) {
                () async throws(TokenFetchError) -> FetchedToken in
                fetched.add(1, ordering: .relaxed)
                return FetchedToken(accessToken: "t", lifetime: .seconds(300))
            }
        }
        try await Task.sleep(for: .milliseconds(100))
        givenUp.cancel()
        let result = await givenUp.value
        #expect((try? result.get()) == nil, "a fetch given up answers a failure")
        #expect(await first.value == .missing)
        try await Task.sleep(for: .milliseconds(500))
        #expect(server.received.filter { $0 == "GETRANGE" }.count == 1, "\(server.received)")
        #expect(fetched.load(ordering: .relaxed) == 0)
        await stopping(store)
    }

    /// The lease script answers -1 when the record changed since the store read it, and the store
    /// reads it again. A Redis that always says so (or a record rewritten without end) once had
    /// the store ask tens of thousands of times a second, holding a core.
    @Test func aLeaseScriptThatAlwaysSaysTheRecordChangedIsNotAskedInABusyLoop() async throws {
        let server = try ScriptedRedis { name in
            switch name {
            case "SUBSCRIBE":
                [.send(Self.confirmation)]
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            case "GETRANGE": [.send(Array("$0\r\n\r\n".utf8))]
            case "EVAL": [.send(Array(":-1\r\n".utf8))]
            default: [.send(Array("+OK\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 2000), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        let fetched = Mutex(0)
        let started = ContinuousClock.now
        let asking = Task {
            await store.fetchForFleet("orders", settings: "s", current: 0, forced: false) {
                () async throws(TokenFetchError) -> FetchedToken in
                fetched.withLock { $0 += 1 }
                return FetchedToken(accessToken: "t", lifetime: .seconds(300))
            }
        }
        // The first looks at once, and two more after waits.
        let looks = RedisTokenStore.rereadsAtOnce + 3
        #expect(await eventually(within: 30) { server.received.filter { $0 == "EVAL" }.count >= looks })
        try await Task.sleep(for: .seconds(1))
        asking.cancel()
        _ = await asking.value
        let asked = server.received.filter { $0 == "EVAL" }.count
        // Each wait between two looks lasts 500 ms at least, however slow the machine: a busy
        // loop asks thousands of times in the same while.
        let waits = Int((started.duration(to: .now) / .milliseconds(500)).rounded(.up))
        #expect(asked <= RedisTokenStore.rereadsAtOnce + 1 + waits + 1, "asked \(asked) times in \(waits) half-seconds")
        #expect(fetched.withLock { $0 } == 0, "a record that changed is read, not fetched again")
        await stopping(store)
    }

    /// After each (re)connection the subscriber reads every watched record once. A Redis that
    /// repeats the subscription's confirmation once had a read of every watched record queued
    /// for each: 6.5 million in a review's 10 s, over a GB of memory, and the refreshes' calls to
    /// Redis waited behind them while the tokens expired.
    @Test func aRedisRepeatingTheSubscriptionsConfirmationGetsOneCatchUp() async throws {
        let server = try ScriptedRedis { name in
            switch name {
            // Late enough for the watch below to be in place.
            case "SUBSCRIBE":
                [.pause(milliseconds: 300), .send(Array(repeating: Self.confirmation, count: 20_000).flatMap { $0 })]
            case "PTTL": [.send(Array(":-2\r\n".utf8))]
            case "GETRANGE": [.send(Array("$0\r\n\r\n".utf8))]
            default: [.send(Array("+OK\r\n".utf8))]
            }
        }
        defer { server.stop() }
        let store = try RedisTokenStore(
            settings: settings(server, timeoutMsec: 2000), password: nil, cipher: AESGCM(key: Self.sealingKey)!)
        _ = store.watch("orders", settings: "s") { _, _ in }
        #expect(await eventually(within: 20) { server.received.contains("GETRANGE") })
        // Every confirmation has been read by now, or is being read: what follows them is one read.
        try await Task.sleep(for: .seconds(1))
        #expect(server.received.filter { $0 == "GETRANGE" }.count == 1)
        await stopping(store)
    }
}
