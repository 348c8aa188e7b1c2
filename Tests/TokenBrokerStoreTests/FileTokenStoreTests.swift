import Foundation
import Glibc
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSinks
import TokenBrokerTestSupport

@testable import TokenBrokerStore

/// The `file` store in a private temporary directory: records kept sealed, one file per key,
/// mode 0600, and refused when they are not the store's own.
@Suite struct FileTokenStoreTests {
    private static let key = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 11 &+ 1) }
    private static let secret = "eyJhbGciOiJSUzI1NiJ9.dG9wLXNlY3JldA.c2lnbmF0dXJlLWJ5dGVz"

    private static let token = StoredToken(
        accessToken: secret, tokenType: "Bearer", scope: "read", version: 3,
        issuedAt: WallTime(timeIntervalSince1970: 1_700_000_000),
        expiresAt: WallTime(timeIntervalSince1970: 1_700_000_900))

    /// What the store reported of its writes.
    private final class SaveReports: Sendable {
        private let reports = Lock<[(key: String, problem: String?)]>([])
        var all: [(key: String, problem: String?)] { reports.withLock { $0 } }
        func add(_ key: String, _ problem: String?) { reports.withLock { $0.append((key, problem)) } }
    }

    /// The store's wall clock, and the work it asked to run later, run when a test says.
    private final class Time: Sendable {
        private let state = Lock<(now: WallTime, pending: [(delay: Duration, work: @Sendable () -> Void)])>(
            (WallTime(timeIntervalSince1970: 1_700_000_000), []))
        var now: WallTime { state.withLock { $0.now } }
        var delays: [Duration] { state.withLock { $0.pending.map(\.delay) } }
        func advance(seconds: Double) { state.withLock { $0.now = $0.now.addingTimeInterval(seconds) } }
        func after(_ delay: Duration, _ work: @escaping @Sendable () -> Void) {
            state.withLock { $0.pending.append((delay, work)) }
        }
        /// Runs the work due so far, as the timers would have.
        func runPending() {
            let due = state.withLock { state in
                defer { state.pending = [] }
                return state.pending
            }
            for (_, work) in due { work() }
        }
    }

    /// A temporary folder that only its owner may enter and write (mode 0700), the store's directory.
    private struct Setup {
        let folder: TemporaryDirectory
        let directory: SinkDirectory
        let reports = SaveReports()
        let removals = SaveReports()
        let time = Time()
        let store: FileTokenStore

        init(key: [UInt8] = FileTokenStoreTests.key) throws {
            folder = try TemporaryDirectory()
            #expect(chmod(folder.url.path, 0o700) == 0)
            directory = try SinkDirectory.open(folder.url.path).get()
            let (reports, removals, time) = (reports, removals, time)
            store = FileTokenStore(
                directory: directory, cipher: AESGCM(key: key)!, onSave: reports.add, onRemove: removals.add,
                wallClock: { time.now }, after: time.after)
        }

        /// Another store on the same directory, as a broker started again opens it.
        func reopened(key: [UInt8] = FileTokenStoreTests.key) throws -> FileTokenStore {
            FileTokenStore(directory: try SinkDirectory.open(folder.url.path).get(), cipher: AESGCM(key: key)!)
        }

        var names: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: folder.url.path)) ?? []).sorted() }

        func bytes(_ path: String) -> [UInt8] { Array(FileManager.default.contents(atPath: path) ?? Data()) }

        func write(_ bytes: [UInt8], to path: String) throws {
            try Data(bytes).write(to: URL(fileURLWithPath: path))
        }
    }

    /// The permission bits of `path`, not following a final link; nil when missing.
    private func modeBits(_ path: String) -> mode_t? {
        var status = stat()
        guard lstat(path, &status) == 0 else { return nil }
        return status.st_mode & 0o7777
    }

    /// The reason the store refuses what it keeps under `key`; records the issue otherwise.
    private func refusal(_ store: FileTokenStore, _ key: String = "orders") async -> String? {
        let load = await store.load(key)
        guard case .refused(let reason) = load else {
            Issue.record("the record should be refused, not \(load)")
            return nil
        }
        #expect(!reason.contains(Self.secret), "the reason quotes the token")
        #expect(!reason.contains("dG9wLXNlY3JldA"), "the reason quotes part of the token")
        return reason
    }

    @Test func aSavedRecordLoadsBack() async throws {
        let setup = try Setup()
        setup.store.save("orders", Self.token)
        setup.store.flush()
        #expect(await setup.store.load("orders") == .found(Self.token))
        #expect(await setup.store.load("billing") == .missing, "another key has no record")
        #expect(try await setup.reopened().load("orders") == .found(Self.token), "a broker started again reads it")
        #expect(setup.reports.all.map(\.key) == ["orders"])
        #expect(setup.reports.all.first?.problem == nil)
    }

    /// `load` reads on the store's queue (the caller suspends, its thread does no file I/O), after
    /// the writes handed to the store before it: a load right after a save, without `flush`,
    /// reads what was saved.
    @Test func aLoadRunsOnTheStoresQueueAfterTheWritesHandedToItBefore() async throws {
        let setup = try Setup()
        for number in 1...20 {
            var token = Self.token
            token.version = UInt64(number)
            setup.store.save("orders-\(number)", token)
            #expect(await setup.store.load("orders-\(number)") == .found(token), "load \(number)")
        }
    }

    @Test func nothingSavedIsMissing() async throws {
        let setup = try Setup()
        #expect(await setup.store.load("orders") == .missing)
        #expect(setup.names.isEmpty, "a load writes nothing")
    }

    @Test func aRecordsFileIsNamedByTheSHA256OfItsKeyAndHasMode0600() async throws {
        let setup = try Setup()
        let key = "t\naudience=https://api.example"
        setup.store.save(key, Self.token)
        setup.store.flush()
        let keyPath = setup.folder.path("key-text")
        try setup.write(Array(key.utf8), to: keyPath)
        let digest = String(try OpenSSL.run(["dgst", "-sha256", "-r", keyPath]).prefix(64))
        try FileManager.default.removeItem(atPath: keyPath)
        #expect(setup.names == [digest + ".record"])
        #expect(setup.store.path(for: key) == setup.folder.url.path + "/" + digest + ".record")
        #expect(modeBits(setup.store.path(for: key)) == 0o600)
        #expect(!setup.names[0].contains("api.example"), "no value reaches a path")
    }

    @Test func theModeIs0600WhateverTheUmask() async throws {
        let setup = try Setup()
        let previous = umask(0)
        setup.store.save("orders", Self.token)
        setup.store.flush()
        umask(previous)
        #expect(modeBits(setup.store.path(for: "orders")) == 0o600)
    }

    @Test func theFileDoesNotHoldTheTokenInClear() async throws {
        let setup = try Setup()
        setup.store.save("orders", Self.token)
        setup.store.flush()
        let bytes = setup.bytes(setup.store.path(for: "orders"))
        #expect(bytes.starts(with: Array("TBSTORE1".utf8)))
        for text in [Self.secret, "dG9wLXNlY3JldA", "Bearer", "orders", "access_token"] {
            #expect(!Data(bytes).contains(Data(text.utf8)), "\(text) appears in clear")
        }
    }

    @Test func aLaterSaveReplacesTheRecordAndLeavesNoOtherFile() async throws {
        let setup = try Setup()
        for version in 1...5 {
            var token = Self.token
            token.version = UInt64(version)
            token.accessToken = "token-\(version)"
            setup.store.save("orders", token)
        }
        setup.store.flush()
        guard case .found(let token) = await setup.store.load("orders") else {
            Issue.record("the last record should load")
            return
        }
        #expect(token.version == 5)
        #expect(token.accessToken == "token-5")
        #expect(setup.names.count == 1, "no temporary file is left: \(setup.names)")
    }

    @Test func flushWaitsForEveryWriteHandedToTheStore() async throws {
        let setup = try Setup()
        let keys = (0..<40).map { "provider-\($0)" }
        for (index, key) in keys.enumerated() {
            var token = Self.token
            token.version = UInt64(index + 1)
            setup.store.save(key, token)
        }
        setup.store.flush()
        // No waiting after the flush: every write has ended, and been reported.
        #expect(setup.reports.all.count == keys.count)
        #expect(setup.reports.all.map(\.key) == keys, "writes run in the order they were handed over")
        #expect(setup.reports.all.allSatisfy { $0.problem == nil })
        #expect(setup.names.count == keys.count)
        for (index, key) in keys.enumerated() {
            guard case .found(let token) = await setup.store.load(key) else {
                Issue.record("\(key) should be saved")
                continue
            }
            #expect(token.version == UInt64(index + 1))
        }
    }

    @Test func saveReturnsBeforeTheWriteAndAFailedWriteIsReported() async throws {
        let setup = try Setup()
        // A directory where the record's file should be: the rename over it fails, even for root.
        try FileManager.default.createDirectory(
            atPath: setup.store.path(for: "orders"), withIntermediateDirectories: false)
        setup.store.save("orders", Self.token)
        setup.store.flush()
        let reports = setup.reports.all
        #expect(reports.count == 1)
        #expect(reports.first?.key == "orders")
        let problem = try #require(reports.first?.problem)
        #expect(!problem.contains(Self.secret))
        #expect(setup.names.count == 1, "the failed write leaves no temporary file: \(setup.names)")
        #expect(await refusal(setup.store)?.contains("not a regular file") == true)
    }

    /// A record too large to be read back is not written: the save is reported failed (and the
    /// broker logs and counts it), and the record the store held stays.
    @Test func aRecordTooLargeToReadBackIsNotWrittenAndTheSaveIsReportedFailed() async throws {
        let setup = try Setup()
        setup.store.save("orders", Self.token)
        var huge = Self.token
        huge.version = 4
        huge.scope = String(repeating: "s", count: StoreRecord.maximumSize)
        setup.store.save("orders", huge)
        setup.store.flush()
        let reports = setup.reports.all
        #expect(reports.map(\.key) == ["orders", "orders"])
        #expect(reports.first?.problem == nil)
        let problem = try #require(reports.last?.problem)
        #expect(problem.contains("larger than"), "\(problem)")
        #expect(!problem.contains(Self.secret))
        #expect(await setup.store.load("orders") == .found(Self.token), "the last record that could be read stays")
    }

    @Test func aCorruptFileIsRefused() async throws {
        let setup = try Setup()
        let path = setup.store.path(for: "orders")
        try setup.write(Array("garbage that is no record".utf8), to: path)
        let garbage = await refusal(setup.store)
        #expect(garbage?.hasPrefix(path + " ") == true, "the reason names the file")
        #expect(garbage?.contains("is not a token-broker store record") == true)

        setup.store.save("orders", Self.token)
        setup.store.flush()
        var bytes = setup.bytes(path)
        bytes[bytes.count / 2] ^= 0x10
        try setup.write(bytes, to: path)
        #expect(await refusal(setup.store)?.contains("does not authenticate") == true)

        try setup.write(Array(bytes.prefix(20)), to: path)
        #expect(await refusal(setup.store)?.contains("does not authenticate") == true, "truncated")

        try setup.write([], to: path)
        #expect(await refusal(setup.store)?.contains("is not a token-broker store record") == true, "empty")
    }

    @Test func anotherProvidersRecordIsRefused() async throws {
        let setup = try Setup()
        setup.store.save("billing", Self.token)
        setup.store.flush()
        // Copied over `orders`' own file: it was sealed for `billing`.
        try setup.write(setup.bytes(setup.store.path(for: "billing")), to: setup.store.path(for: "orders"))
        #expect(await refusal(setup.store, "orders")?.contains("does not authenticate") == true)
        #expect(await setup.store.load("billing") == .found(Self.token))
    }

    @Test func aRecordSealedUnderAnotherKeyIsRefused() async throws {
        let setup = try Setup()
        setup.store.save("orders", Self.token)
        setup.store.flush()
        var other = Self.key
        other[5] ^= 0xFF
        let reason = await refusal(try setup.reopened(key: other))
        #expect(reason?.contains("does not authenticate") == true)
        #expect(reason?.contains(setup.store.path(for: "orders")) == true)
    }

    @Test func anOversizeFileIsRefusedUnread() async throws {
        let setup = try Setup()
        let path = setup.store.path(for: "orders")
        try setup.write(
            Array("TBSTORE1".utf8) + [UInt8](repeating: 0x41, count: StoreRecord.maximumSize), to: path)
        let reason = await refusal(setup.store)
        #expect(reason == "cannot read \(path): is larger than \(StoreRecord.maximumSize) bytes")
    }

    @Test func aFIFOInPlaceOfTheFileIsRefusedWithoutWaiting() async throws {
        let setup = try Setup()
        let path = setup.store.path(for: "orders")
        #expect(mkfifo(path, 0o600) == 0)
        #expect(await refusal(setup.store)?.contains("not a regular file") == true)
    }

    // MARK: - Forgotten keys (dropped template children)

    @Test func aForgottenRecordGoesOnceItsTokenHasExpired() async throws {
        let setup = try Setup()
        setup.store.save("t\nscope=a", Self.token)  // expires 900 s after the clock's now
        setup.store.forget("t\nscope=a")
        setup.store.flush()
        #expect(setup.names.count == 1, "kept while its token is valid: a child made again starts with it")
        #expect(setup.time.delays == [.seconds(900)], "looked at again when the token expires")
        setup.time.advance(seconds: 900)
        setup.time.runPending()
        setup.store.flush()
        #expect(setup.names.isEmpty)
        #expect(setup.removals.all.map(\.key) == ["t\nscope=a"] && setup.removals.all[0].problem == nil)
        #expect(setup.time.delays.isEmpty, "nothing more to look at")
    }

    @Test func aRecordSavedAgainAfterItsKeyWasForgottenIsKept() async throws {
        let setup = try Setup()
        setup.store.save("t\nscope=a", Self.token)
        setup.store.forget("t\nscope=a")
        setup.store.save("t\nscope=a", Self.token)  // a child made again for the same values
        setup.store.flush()
        setup.time.advance(seconds: 1000)
        setup.time.runPending()
        setup.store.flush()
        #expect(setup.names.count == 1)
        #expect(setup.removals.all.isEmpty)
        #expect(await setup.store.load("t\nscope=a") == .found(Self.token))
    }

    @Test func aTokenWithoutExpiryOrARecordThatDoesNotOpenGoesAtOnce() async throws {
        let setup = try Setup()
        var forever = Self.token
        forever.expiresAt = nil
        setup.store.save("forever", forever)
        try setup.write(Array("TBSTORE1 not a record".utf8), to: setup.store.path(for: "garbage"))
        setup.store.save("expired", Self.token)
        setup.time.advance(seconds: 901)
        for key in ["forever", "garbage", "expired"] { setup.store.forget(key) }
        setup.store.flush()
        #expect(setup.names.isEmpty, "\(setup.names)")
        #expect(setup.removals.all.map(\.key) == ["forever", "garbage", "expired"])
        #expect(setup.time.delays.isEmpty)
    }

    @Test func aForgottenKeyWithoutARecordLeavesNothingToDo() async throws {
        let setup = try Setup()
        setup.store.forget("never-saved")
        setup.store.flush()
        #expect(setup.removals.all.isEmpty && setup.time.delays.isEmpty && setup.names.isEmpty)
    }

    @Test func aKeyForgottenTwiceHasOneCheckAndOneSavedAgainStartsOver() async throws {
        let setup = try Setup()
        setup.store.save("k", Self.token)
        setup.store.forget("k")
        setup.store.forget("k")  // a child made again from the record, without a fetch, dropped again
        setup.store.flush()
        #expect(setup.time.delays == [.seconds(900)], "one check per key")
        setup.store.save("k", Self.token)
        setup.store.forget("k")
        setup.store.flush()
        #expect(setup.time.delays.count == 2)
        setup.time.advance(seconds: 900)
        setup.time.runPending()  // the first check is stale: only the second removes
        setup.store.flush()
        #expect(setup.names.isEmpty && setup.removals.all.count == 1)
        setup.store.save("k", Self.token)  // the key in use again: a new writer
        setup.store.flush()
        #expect(setup.names.count == 1 && setup.reports.all.allSatisfy { $0.problem == nil })
    }

    @Test func aForgottenKeyLoadedAgainIsKept() async throws {
        let setup = try Setup()
        setup.store.save("k", Self.token)
        setup.store.forget("k")
        setup.store.flush()
        #expect(await setup.store.load("k") == .found(Self.token))  // a child made again, served from it
        setup.store.flush()
        setup.time.advance(seconds: 900)
        setup.time.runPending()
        setup.store.flush()
        #expect(setup.names.count == 1 && setup.removals.all.isEmpty)
    }

    @Test func aRecordThatCannotBeReadIsLeftAndReported() async throws {
        let setup = try Setup()
        #expect(mkdir(setup.store.path(for: "k"), 0o700) == 0)
        setup.store.forget("k")
        setup.store.flush()
        #expect(setup.names == [(setup.store.path(for: "k") as NSString).lastPathComponent])
        #expect(setup.removals.all.count == 1 && setup.removals.all[0].problem?.contains("cannot read") == true)
        #expect(setup.time.delays.isEmpty)
    }

    @Test func aTokenThatLivesForYearsIsLookedAtDaily() async throws {
        let setup = try Setup()
        var long = Self.token
        long.expiresAt = setup.time.now.addingTimeInterval(10 * 365 * 86_400)
        setup.store.save("long", long)
        setup.store.forget("long")
        setup.store.flush()
        #expect(setup.time.delays == [FileTokenStore.longestWait])
        setup.time.advance(seconds: 86_400)
        setup.time.runPending()
        setup.store.flush()
        #expect(setup.names.count == 1 && setup.time.delays == [FileTokenStore.longestWait])
    }
}
