import Glibc
import Testing
import TokenBrokerCore

@testable import token_broker

/// `Broker.makeSources` and `Broker.loadCallerKeys`, which start and `--check-config` share: what
/// they refuse becomes "invalid configuration" and exit status 2.
@Suite struct BrokerTests {
    @Test func eachKindIsBuiltAndOnlyTheLocalSignerComesWithOne() throws {
        let directory = try TemporaryDirectory()
        let sources = try Broker.makeSources(
            try configuration(
                #"""
                {"providers": [
                    {"name": "signed", "source": {"type": "jwt"}},
                    {"name": "file", "source": {"type": "file", "path": "\#(directory.path("token"))"}},
                    {"name": "oauth", "source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:1/token", "clientID": "c",
                                                 "clientSecretFile": "\#(directory.path("secret"))"}},
                    {"name": "http", "source": {"type": "http", "url": "http://127.0.0.1:1/token"}}
                ]}
                """#))
        #expect(sources.count == 4)
        #expect(sources.map { $0.1 != nil } == [true, false, false, false])
        #expect(sources[0].1?.configuration.algorithm == .es256)
    }

    @Test func filesReadAtEachFetchAreNotReadAtStart() throws {
        // A token file and a client secret file may appear later (a mounted secret): start does not
        // refuse them; each fetch reads them.
        let directory = try TemporaryDirectory()
        #expect(try sourceProblem(#"[{"source": {"type": "file", "path": "\#(directory.path("absent"))"}}]"#) == nil)
        #expect(
            try sourceProblem(
                #"""
                [{"source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:1/token", "clientID": "c",
                             "clientSecretFile": "\#(directory.path("absent"))"}}]
                """#) == nil)
    }

    @Test func aReusedSourceIsKeptAsItIsAndItsFilesReadAtEachFetchAreStillChecked() throws {
        // A reload's unchanged providers: no key is made again, but a client secret file that
        // can no longer be read is refused, as for any provider.
        let directory = try TemporaryDirectory()
        let secret = try directory.write("secret", "s3cret")
        let settings = try configuration(
            #"""
            {"providers": [
                {"name": "signed", "source": {"type": "jwt", "algorithm": "RS256"}},
                {"name": "oauth", "source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:1/token", "clientID": "c",
                                             "clientSecretFile": "\#(secret)"}}
            ]}
            """#)
        let first = try Broker.makeSources(settings)
        let reused = ["signed": first[0], "oauth": first[1]]
        let again = try Broker.makeSources(settings, reusing: reused)
        #expect(again[0].1?.keyID == first[0].1?.keyID)
        #expect(try Broker.makeSources(settings)[0].1?.keyID != first[0].1?.keyID, "a key made anew is another")
        #expect(unlink(secret) == 0 && mkdir(secret, 0o700) == 0)
        #expect(throws: ConfigurationError.self) { try Broker.makeSources(settings, reusing: reused) }
    }

    @Test func aMissingSigningKeyIsNamedUnderItsProvidersSource() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.path("missing.pem")
        let problem = try sourceProblem(#"[{"name": "a"}, {"name": "b", "source": {"keyFile": "\#(missing)"}}]"#)
        #expect(problem?.key == "providers[1].source")
        #expect(problem?.message.hasPrefix("cannot read \(missing): ") == true, "\(String(describing: problem))")
    }

    @Test(arguments: ["ES256", "RS256"])
    func aKeyFileThatHoldsNoKeyIsRefused(_ algorithm: String) throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write("key.pem", "not a key\n")
        let problem = try sourceProblem(#"[{"source": {"algorithm": "\#(algorithm)", "keyFile": "\#(path)"}}]"#)
        #expect(problem?.key == "providers[0].source")
        #expect(problem?.message.contains(path) == true, "\(String(describing: problem))")
    }

    @Test func aShortHS256SecretIsRefused() throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write("secret", "too short\n")
        let problem = try sourceProblem(#"[{"source": {"algorithm": "HS256", "keyFile": "\#(path)"}}]"#)
        #expect(problem?.key == "providers[0].source")
        #expect(problem != nil)
    }

    @Test func aPrivateKeyJWTClientsKeyIsReadAtStart() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.path("client.pem")
        func oauth2(_ keyFile: String) -> String {
            #"""
            [{"source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:1/token", "clientID": "c",
                         "clientAuth": "private_key_jwt", "privateKeyFile": "\#(keyFile)"}}]
            """#
        }
        let absent = try sourceProblem(oauth2(missing))
        #expect(absent?.key == "providers[0].source")
        #expect(absent?.message.hasPrefix("cannot read \(missing): ") == true, "\(String(describing: absent))")
        let garbage = try directory.write(
            "garbage.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        let refused = try sourceProblem(oauth2(garbage))
        #expect(refused?.key == "providers[0].source")
        #expect(refused?.message.contains(garbage) == true, "\(String(describing: refused))")
    }

    @Test func withoutAKeysFileThereIsNoCallerKeyStore() throws {
        #expect(try Broker.loadCallerKeys(try configuration("{}")) == nil)
    }

    @Test func aKeysFileIsReadForTheConfiguredProviders() throws {
        let directory = try TemporaryDirectory()
        let keys = try directory.write(
            "callers.json",
            #"{"keys": [{"name": "a", "sha256": "\#(String(repeating: "ab", count: 32))", "providers": ["default"]}]}"#)
        let store = try Broker.loadCallerKeys(try configuration(#"{"clientKeysFile": "\#(keys)"}"#))
        #expect(store?.count == 1)
        #expect(store?.path == keys)
    }

    @Test func aMissingOrWrongKeysFileIsRefusedNamingClientKeysFile() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.path("callers.json")
        let unknown = try directory.write(
            "unknown.json",
            #"{"keys": [{"name": "a", "sha256": "\#(String(repeating: "ab", count: 32))", "providers": ["nope"]}]}"#)
        for path in [missing, unknown] {
            let settings = try configuration(#"{"clientKeysFile": "\#(path)"}"#)
            do {
                _ = try Broker.loadCallerKeys(settings)
                Issue.record("\(path) was accepted")
            } catch {
                #expect(error.description.hasPrefix("clientKeysFile"), "\(error)")
            }
            #expect(throws: ConfigurationError.self) { try Options.check(settings) }
        }
    }

    @Test func checkConfigBuildsTheSourcesAsStartWould() throws {
        let directory = try TemporaryDirectory()
        #expect(throws: ConfigurationError.self) {
            try Options.check(
                try configuration(#"{"providers": [{"source": {"keyFile": "\#(directory.path("none.pem"))"}}]}"#))
        }
        try Options.check(
            try configuration(#"{"providers": [{"name": "a"}, {"name": "b", "source": {"algorithm": "RS256"}}]}"#))
    }
}

/// The connection limit that fits in the open-file limit (`ProcessLimits.fittedConnectionLimit`).
@Suite struct ConnectionLimitTests {
    @Test func theConfiguredLimitStandsWhenTheDescriptorsSuffice() {
        #expect(
            ProcessLimits.fittedConnectionLimit(
                configured: 16_000, openFiles: 1_048_576, perConnection: 2, upstream: 2_048) == 16_000)
    }

    @Test func lessWhenTheyWouldRunOutBeforeIt() {
        // 2,000 descriptors: 128 kept aside, 256 for the admin listener, 512 for libcurl's caches,
        // and two for each proxied connection: 552 connections fit.
        let limit = ProcessLimits.fittedConnectionLimit(
            configured: 1_500, openFiles: 2_000, perConnection: 2, upstream: 512)
        #expect(limit == 552)
        #expect(limit * 2 + 512 + 256 + 128 <= 2_000)
        // The token listener and a protocol listener of its own, one descriptor a connection each.
        #expect(
            ProcessLimits.fittedConnectionLimit(configured: 1_000, openFiles: 1_100, perConnection: 2, upstream: 32)
                == 342)
    }

    @Test func neverBelowTheLeastLimit() {
        #expect(
            ProcessLimits.fittedConnectionLimit(configured: 1_000, openFiles: 100, perConnection: 3, upstream: 32) == 16
        )
    }
}
