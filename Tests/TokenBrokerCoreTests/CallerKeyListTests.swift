import Testing

@testable import TokenBrokerCore

/// `clientKeysFile` parsing. The hashes are SHA-256 of "key-a" and "key-b", computed with
/// `printf %s key-a | sha256sum`, not by the broker's code.
@Suite struct CallerKeyListTests {
    static let hashA = "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4"
    static let hashB = "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634"
    let providers: Set<String> = ["default", "payments"]

    private func list(_ json: String) throws(ConfigurationError) -> CallerKeyList {
        try CallerKeyList(json: Array(json.utf8), knownProviders: providers)
    }

    @Test func entriesListTheirProvidersOrAllOfThem() throws {
        let keys = try list(
            #"{"keys": [{"name": "billing", "sha256": "\#(Self.hashA)", "providers": ["default"]}, {"name": "ops", "sha256": "\#(Self.hashB.uppercased())", "providers": ["*"]}]}"#
        )
        #expect(keys.entries.count == 2)
        #expect(keys.entries[0].mayRead("default") && !keys.entries[0].mayRead("payments"))
        #expect(keys.entries[1].mayRead("payments") && keys.entries[1].mayRead("anything"))
        #expect(
            keys.entries[0].digest.count == 32 && keys.entries[0].digest[0] == 0xF1
                && keys.entries[0].digest[31] == 0xF4)
    }

    @Test(arguments: [
        (#"{}"#, "keys: is required"),
        (#"{"keys": [], "extra": 1}"#, "extra: unknown key"),
        (#"{"keys": [{"name": "a", "sha256": "zz", "providers": ["default"]}]}"#, "keys[0].sha256"),
        (#"{"keys": [{"name": "a", "sha256": "\#(hashA)", "providers": []}]}"#, "keys[0].providers"),
        (
            #"{"keys": [{"name": "a", "sha256": "\#(hashA)", "providers": ["billing"]}]}"#,
            "no provider is named \"billing\""
        ),
        (#"{"keys": [{"name": "a b", "sha256": "\#(hashA)", "providers": ["default"]}]}"#, "keys[0].name"),
        (
            #"{"keys": [{"name": "a", "sha256": "\#(hashA)", "providers": ["default"]}, {"name": "b", "sha256": "\#(hashA)", "providers": ["default"]}]}"#,
            "listed twice"
        ),
        (
            #"{"keys": [{"name": "a", "key": "plaintext", "sha256": "\#(hashA)", "providers": ["default"]}]}"#,
            "keys[0].key: unknown key"
        ),
        ("not json", "not valid JSON"),
    ])
    func badFilesAreRefusedNamingTheProblem(_ json: String, _ needle: String) {
        do {
            _ = try list(json)
            Issue.record("accepted \(json)")
        } catch {
            #expect(error.description.contains(needle), "\(error.description)")
        }
    }

    @Test(arguments: [
        (#"{"keys": [{"name": "a", "sha256": "zz", "providers": ["default"]}]}"#, "keys[0].sha256: is not a SHA-256"),
        (
            #"{"keys": [{"name": "a", "sha256": "\#(hashA)0", "providers": ["default"]}]}"#,
            "keys[0].sha256: is not a SHA-256"
        ),
        (
            #"{"keys": [{"name": "a", "sha256": "\#(hashA)00", "providers": ["default"]}]}"#,
            "keys[0].sha256: is not a SHA-256"
        ),
        (#"{"keys": [{"name": "a", "providers": ["default"]}]}"#, "keys[0].sha256: is required"),
        (
            #"{"keys": [{"name": "a b", "sha256": "\#(hashA)", "providers": ["default"]}]}"#,
            "keys[0].name: \"a b\" is not a caller name"
        ),
        (#"{"keys": [{"sha256": "\#(hashA)", "providers": ["default"]}]}"#, "keys[0].name: is required"),
    ])
    func aMalformedValueIsReportedAsMalformedAndAMissingOneAsRequired(_ json: String, _ needle: String) {
        do {
            _ = try list(json)
            Issue.record("accepted \(json)")
        } catch {
            #expect(error.description.contains(needle), "\(error.description)")
            #expect(!error.description.contains(Self.hashA), "the value is not repeated")
        }
    }
}
