import Foundation
import Testing
import TokenBrokerCore
@testable import TokenBrokerSources

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
        for header in [nil, "", "Bearer", "Bearer ", "Basic a2V5LWE=", "key-a", "Bearer key a"] as [String?] {
            #expect(store.authorize(header, provider: "default") == .missingKey, "\(String(describing: header))")
        }
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
}
