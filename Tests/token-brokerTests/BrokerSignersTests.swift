import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerTestSupport

@testable import token_broker

/// What start, `--check-config` and each reload refuse in the local signers' settings
/// (`BrokerSigners.swift`): two different keys under one `kid`, and claims too long for any token.
/// test_keys_and_startup.py and test_reload.py verify the served tokens with PyJWT.
@Suite struct BrokerSignersTests {
    /// An EC P-256 key made by the `openssl` command line, at `name` in `directory`.
    private func ecKey(_ directory: TemporaryDirectory, _ name: String) throws -> String {
        let path = directory.path(name)
        try OpenSSL.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path])
        return path
    }

    // MARK: - One key under each kid

    @Test func twoProvidersWithDifferentKeysUnderOneKidAreRefusedNamingBoth() throws {
        let directory = try TemporaryDirectory()
        let (first, second) = (try ecKey(directory, "first.pem"), try ecKey(directory, "second.pem"))
        let secret = directory.path("secret")
        try Data(String(repeating: "s", count: 40).utf8).write(to: URL(fileURLWithPath: secret))
        let problem = try sourceProblem(
            #"""
            [{"name": "one", "source": {"keyFile": "\#(first)", "kid": "main"}},
             {"name": "hmac", "source": {"algorithm": "HS256", "keyFile": "\#(secret)", "kid": "main"}},
             {"name": "two", "source": {"keyFile": "\#(second)", "kid": "main"}}]
            """#)
        #expect(problem?.key == "providers[2].source.kid")
        #expect(
            problem?.message.hasPrefix(
                #"provider "two" signs with another key than provider "one" under the same kid "main""#)
                == true, "\(String(describing: problem))")
    }

    @Test func theSameKeyUnderOneKidAndAnHS256SecretUnderAPublishedKeysKidAreNoClash() throws {
        let directory = try TemporaryDirectory()
        let key = try ecKey(directory, "key.pem")
        let secret = directory.path("secret")
        try Data(String(repeating: "s", count: 40).utf8).write(to: URL(fileURLWithPath: secret))
        #expect(
            try sourceProblem(
                #"""
                [{"name": "hmac", "source": {"algorithm": "HS256", "keyFile": "\#(secret)", "kid": "main"}},
                 {"name": "one", "source": {"keyFile": "\#(key)", "kid": "main"}},
                 {"name": "two", "source": {"keyFile": "\#(key)", "kid": "main", "audience": "two"}},
                 {"name": "three", "source": {"keyFile": "\#(key)"}}]
                """#) == nil)
    }

    @Test func aKeyAReloadRetiredKeepsItsKidUntilItsTokensExpire() throws {
        let directory = try TemporaryDirectory()
        let (old, new) = (try ecKey(directory, "old.pem"), try ecKey(directory, "new.pem"))
        let settings = try configuration(
            #"{"providers": [{"name": "p", "source": {"keyFile": "\#(new)", "kid": "k"}}]}"#)
        let sources = try Broker.makeSources(settings)
        let now = ContinuousClock.now
        let retired = Broker.RetiredSigner(
            signer: try JWTSigner(configuration: JWTSourceConfiguration(keyFile: old, keyID: "k")), provider: "p",
            until: now.advanced(by: .seconds(60)))
        let problem = Broker.keyIDClash(settings, sources, retired: [retired], now: now)
        #expect(problem?.key == "providers[0].source.kid")
        #expect(
            problem?.message.hasPrefix(
                #"provider "p" would sign with another key under kid "k", which names the key it signed with before a reload, published for 60 s more"#
            )
                == true, "\(String(describing: problem))")
        #expect(problem?.message.contains("keyFile") == false, "it has one")
        #expect(Broker.keyIDClash(settings, sources, retired: [retired], now: now.advanced(by: .seconds(60))) == nil)
        // The same key retired under the kid (other claims) is no clash; nor is another key under another kid.
        let same = Broker.RetiredSigner(
            signer: try JWTSigner(configuration: JWTSourceConfiguration(keyFile: new, keyID: "k", audience: "x")),
            provider: "p", until: retired.until)
        #expect(Broker.keyIDClash(settings, sources, retired: [same], now: now) == nil)
        let elsewhere = Broker.RetiredSigner(
            signer: try JWTSigner(configuration: JWTSourceConfiguration(keyFile: old, keyID: "j")), provider: "q",
            until: retired.until)
        #expect(Broker.keyIDClash(settings, sources, retired: [elsewhere], now: now) == nil)
    }

    @Test func aKeyMadeAtStartUnderAConfiguredKidIsToldToTakeAKeyFile() throws {
        let settings = try configuration(#"{"providers": [{"name": "p", "source": {"kid": "k", "audience": "b"}}]}"#)
        let retired = Broker.RetiredSigner(
            signer: try JWTSigner(configuration: JWTSourceConfiguration(keyID: "k", audience: "a")), provider: "gone",
            until: .now.advanced(by: .seconds(600)))
        let problem = Broker.keyIDClash(settings, try Broker.makeSources(settings), retired: [retired])
        #expect(problem?.message.contains(#"which names the key provider "gone" signed with before a reload"#) == true)
        #expect(
            problem?.message.hasSuffix(
                "or a keyFile (without one, each change to the provider makes it a new key)") == true,
            "\(String(describing: problem))")
    }

    // MARK: - Claims too long for any token

    @Test func claimsTooLongForAnyTokenAreRefusedNamingTheLongest() throws {
        let long = String(repeating: "a", count: 20_000)
        for (source, key) in [
            (#"{"audience": "\#(long)"}"#, "audience"), (#"{"kid": "\#(long)", "issuer": "i"}"#, "kid"),
            (#"{"subject": "\#(long)", "audience": "\#(long.prefix(100))"}"#, "subject"),
        ] {
            let problem = try sourceProblem(#"[{"name": "p", "source": \#(source)}]"#)
            #expect(problem?.key == "providers[0].source.\(key)")
            #expect(problem?.message.hasPrefix("makes each token ") == true, "\(String(describing: problem))")
            #expect(problem?.message.contains("more than the 16384 a token may have") == true)
        }
        // A template's child asked for an audience carries its own: the configured one is only a default.
        #expect(
            try sourceProblem(
                #"[{"name": "t", "perRequest": ["audience"], "allowedAudiences": ["api"], "source": {"audience": "\#(long)"}}]"#
            ) == nil)
        let scoped = try sourceProblem(
            #"[{"name": "t", "perRequest": ["scope"], "allowedScopes": ["read"], "source": {"audience": "\#(long)"}}]"#)
        #expect(scoped?.key == "providers[0].source.audience")
        #expect(scoped?.message.hasPrefix("makes each token at least ") == true, "\(String(describing: scoped))")
    }

    @Test func claimsThatFitExactlyPass() throws {
        // The longest audience whose tokens are at most 16384 bytes, found by halving with the
        // signer's own tokens; one byte more is refused.
        func fits(_ length: Int) throws -> Bool {
            let audience = String(repeating: "a", count: length)
            return try JWTSigner(configuration: JWTSourceConfiguration(keyID: "k", audience: audience))
                .shortestTokenBytes(audienceAsked: false) <= TokenRules.maximumTokenBytes
        }
        var (low, high) = (0, TokenRules.maximumTokenBytes)  // fits(low), not fits(high)
        while high - low > 1 {
            let middle = (low + high) / 2
            if try fits(middle) { low = middle } else { high = middle }
        }
        let audience = String(repeating: "a", count: low)
        #expect(try sourceProblem(#"[{"name": "p", "source": {"kid": "k", "audience": "\#(audience)"}}]"#) == nil)
        #expect(try sourceProblem(#"[{"name": "p", "source": {"kid": "k", "audience": "\#(audience)a"}}]"#) != nil)
    }
}
