import Foundation
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import TokenBrokerAPI

/// The caller check: keys hashed and compared, the file re-read when it changes.
@Suite struct CallerKeyStoreTests {
    /// `printf %s key-a | sha256sum`, computed outside the broker.
    static let hashA = "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4"

    private func write(_ json: String, to path: String) throws {
        try Data(json.utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
    }

    @Test func keysAreMatchedByTheirHashAndProvidersAreChecked() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}]}"#, to: path)
        let store = try CallerKeyStore(path: path, knownProviders: ["default", "payments"])
        #expect(store.authorize("Bearer key-a", provider: "default") == .allowed)
        #expect(store.authorize("bearer key-a", provider: "default") == .allowed)
        #expect(store.authorize("Bearer key-a", provider: "payments") == .forbidden(caller: "billing"))
        #expect(store.authorize("Bearer key-b", provider: "default") == .unknownKey)
        #expect(store.authorize("Bearer key-", provider: "default") == .unknownKey)
        for header in [nil, "", "Bearer", "Bearer ", "Bearer  ", "Basic a2V5LWE=", "key-a", "Bearer key a"] as [String?]
        {
            #expect(store.authorize(header, provider: "default") == .missingKey, "\(String(describing: header))")
        }
    }

    /// A key is hashed as the bytes sent: `key-` then 0xFF (not UTF-8) is its own key, not the
    /// one with U+FFFD in its place that a string made of the bytes would read. The hashes are
    /// `printf 'key-\xff' | sha256sum` and `printf 'key-\xef\xbf\xbd' | sha256sum`.
    @Test func aKeyIsHashedAsTheBytesSent() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        let raw = "073f40987690c0300c5c793f618b8375ce14925ee903332ebffacc0923cf13cd"
        let replaced = "f555139b4c06509f6df4e081b9e614580a1f11cc118719942780e3f457cd660c"
        try write(
            #"{"keys": [{"name": "raw", "sha256": "\#(raw)", "providers": ["default"]},"#
                + #"{"name": "replaced", "sha256": "\#(replaced)", "providers": ["payments"]}]}"#, to: path)
        let store = try CallerKeyStore(path: path, knownProviders: ["default", "payments"])
        func authorize(_ header: [UInt8], _ provider: String) -> CallerDecision {
            header.withUnsafeBufferPointer { store.authorize($0, provider: provider) }
        }
        let bearer = Array("Bearer key-".utf8)
        #expect(authorize(bearer + [0xFF], "default") == .allowed)
        #expect(authorize(bearer + [0xFF], "payments") == .forbidden(caller: "raw"))
        #expect(authorize(bearer + [0xEF, 0xBF, 0xBD], "payments") == .allowed)
        #expect(authorize(bearer + [0xEF, 0xBF, 0xBD], "default") == .forbidden(caller: "replaced"))
        #expect(store.authorize("Bearer key-\u{FFFD}", provider: "payments") == .allowed)
        #expect(authorize(bearer + [0xFF, 0xFF], "default") == .unknownKey)
        #expect(authorize(Array("BEARER   key-".utf8) + [0xFF], "default") == .allowed)
        #expect(authorize(bearer + [0xFF, 0x20, 0x61], "default") == .missingKey)
    }

    @Test func aChangedFileIsReloadedAndABrokenOneKeepsThePreviousList() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}]}"#, to: path)
        let store = try CallerKeyStore(path: path, knownProviders: ["default", "payments"])
        #expect(store.reloadIfChanged() == nil)

        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["payments"]}]}"#, to: path)
        #expect(store.reloadIfChanged() == .success(1))
        #expect(store.authorize("Bearer key-a", provider: "payments") == .allowed)
        #expect(store.authorize("Bearer key-a", provider: "default") == .forbidden(caller: "billing"))

        try write(#"{"keys": "#, to: path)
        guard case .failure = store.reloadIfChanged() else {
            Issue.record("a broken file was accepted")
            return
        }
        #expect(store.reloadIfChanged() == nil, "a broken version is reported once")
        #expect(store.authorize("Bearer key-a", provider: "payments") == .allowed)
    }

    /// A file that names a provider the broker does not have yet is refused by the watch, and
    /// not read again until it changes; the configuration reload that adds the provider reads it.
    @Test func aReloadThatAddsAProviderLetsTheKeysNameIt() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}]}"#, to: path)
        let store = try CallerKeyStore(path: path, knownProviders: ["default"])
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["orders"]}]}"#, to: path)
        guard case .failure = store.reloadIfChanged() else {
            Issue.record("a key for an unknown provider was accepted")
            return
        }
        #expect(store.authorize("Bearer key-a", provider: "orders") == .forbidden(caller: "billing"))
        #expect(store.use(knownProviders: ["default", "orders"]) == nil)
        #expect(store.authorize("Bearer key-a", provider: "orders") == .allowed)
        #expect(store.authorize("Bearer key-a", provider: "default") == .forbidden(caller: "billing"))
        // A reload that removes it: the file read against the new set is refused, the list stays.
        #expect(store.use(knownProviders: ["default"]) != nil)
        #expect(store.authorize("Bearer key-a", provider: "orders") == .allowed)
    }

    @Test func aFIFOInPlaceOfTheFileIsRefusedAndTheNextRegularFileIsLoaded() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}]}"#, to: path)
        let store = try CallerKeyStore(path: path, knownProviders: ["default", "payments"])
        try FileManager.default.removeItem(atPath: path)
        #expect(mkfifo(path, 0o600) == 0)
        guard case .failure(let error) = store.reloadIfChanged() else {
            Issue.record("a FIFO was accepted")
            return
        }
        #expect(error.description.contains("is a FIFO, not a regular file"), "\(error)")
        #expect(store.authorize("Bearer key-a", provider: "default") == .allowed, "the previous list stays")
        try FileManager.default.removeItem(atPath: path)
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["payments"]}]}"#, to: path)
        #expect(store.reloadIfChanged() == .success(1))
        #expect(store.authorize("Bearer key-a", provider: "payments") == .allowed)
    }

    @Test func aFileLargerThanTheLimitIsRefusedAtStart() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try Data(repeating: 0x20, count: CallerKeyStore.maxFileBytes + 1).write(to: URL(fileURLWithPath: path))
        #expect(throws: ConfigurationError.self) { try CallerKeyStore(path: path, knownProviders: ["default"]) }
    }

    /// `stop()` returns once the watch's task has ended: no reload runs after it, and what the
    /// watch held (the store, its callback) is let go.
    @Test func stopEndsTheWatchBeforeItReturns() async throws {
        final class Marker: Sendable {}
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try write(#"{"keys": []}"#, to: path)
        var store: CallerKeyStore? = try CallerKeyStore(path: path, knownProviders: ["default"])
        var marker: Marker? = Marker()
        weak let watched = marker
        weak let weakStore = store
        let reloads = Lock(0)
        store!.watch(every: .milliseconds(10)) { [marker] _ in
            _ = marker
            reloads.withLock { $0 += 1 }
        }
        marker = nil
        try write(#"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}]}"#, to: path)
        #expect(await eventually { reloads.withLock { $0 } == 1 })
        #expect(store!.stop(), "the watch ended in time")
        try write(#"{"keys": []}"#, to: path)
        try await Task.sleep(for: .milliseconds(100))
        #expect(reloads.withLock { $0 } == 1, "no reload after stop()")
        store = nil
        #expect(await eventually { watched == nil && weakStore == nil }, "nothing of the watch outlives it")
    }
}

/// The token routes with the real store: the key's caller may read its providers only.
@Suite struct CallerKeyRouteTests {
    @Test func theStoreDecidesWhoReadsWhichProvider() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("callers.json")
        try Data(
            #"{"keys": [{"name": "billing", "sha256": "\#(CallerKeyStoreTests.hashA)", "providers": ["default"]}]}"#
                .utf8
        )
        .write(to: URL(fileURLWithPath: path))
        let store = try CallerKeyStore(path: path, knownProviders: ["default", "payments"])
        let first = FakeProvider(name: "default")
        first.state.withLock { $0.read = .token(FakeProvider.token(), stale: false, secondsLeft: nil) }
        let api = tokenAPI([first, FakeProvider(name: "payments")], callers: store)
        #expect(api.handle(request("/token", headers: [("Authorization", "Bearer key-a")])).immediate?.status == 200)
        expectError(
            api.handle(request("/providers/payments/token", headers: [("Authorization", "Bearer key-a")])).immediate,
            403,
            "provider_not_allowed")
        expectError(
            api.handle(request("/token", headers: [("Authorization", "Bearer key-b")])).immediate, 401,
            "invalid_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker", error="invalid_token""#])
        expectError(
            api.handle(request("/token")).immediate, 401, "missing_caller_key",
            headers: ["WWW-Authenticate": #"Bearer realm="token-broker""#])
    }
}
