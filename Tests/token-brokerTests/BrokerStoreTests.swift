import Testing
import TokenBrokerCore

@testable import token_broker

/// What the broker puts behind a provider's records (`Broker.settingsDigest`): its settings, and
/// the contents of its credential files, read at start and at each reload; which providers are
/// stored at all; and the Redis password a reload finds changed.
@Suite struct BrokerStoreTests {
    private func provider(_ json: String) throws -> ProviderConfiguration {
        try #require(try configuration(#"{"providers": [\#(json)]}"#).providers.first)
    }

    private func digest(_ provider: ProviderConfiguration) -> String {
        Broker.settingsDigest(provider.source, signer: nil, credentials: Broker.credentialDigests(provider))
    }

    /// Two brokers, one configuration, each with its own API key at the same path (two pods'
    /// own mounted Secret): their records once had one digest, made of the path, and each served
    /// the other's tokens (a review's tenant A and tenant B).
    @Test func aHeaderFileHoldingAnotherKeyAtTheSamePathGivesOtherSettings() throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write("api-key", "tenant-a-key\n")
        let waf = try provider(
            #"{"name": "waf", "source": {"type": "http", "url": "https://tokens.example/issue", "#
                + #""headers": {"X-Api-Key": {"file": "\#(path)"}}}}"#)
        let tenantA = digest(waf)
        #expect(digest(waf) == tenantA, "the same contents, the same digest")
        try directory.write("api-key", "tenant-b-key\n")
        let tenantB = digest(waf)
        #expect(tenantB != tenantA)
        for digest in [tenantA, tenantB] {
            #expect(
                digest.utf8.count == 64 && digest.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) })
        }
    }

    /// Every file whose contents are a credential counts, a client certificate included (it names
    /// the client, and a certificate-bound token works only with it); a CA bundle does not.
    @Test func everyCredentialFileCountsAndACABundleDoesNot() throws {
        let directory = try TemporaryDirectory()
        let files = ["secret", "cert.pem", "key.pem", "ca.pem", "assertion.pem"]
        for name in files { try directory.write(name, name + "-1") }
        let oauth = try provider(
            #"{"name": "o", "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "#
                + #""clientID": "c", "clientSecretFile": "\#(directory.path("secret"))", "#
                + #""caFile": "\#(directory.path("ca.pem"))", "clientCertFile": "\#(directory.path("cert.pem"))", "#
                + #""clientKeyFile": "\#(directory.path("key.pem"))"}}"#)
        #expect(
            oauth.source.credentialFiles == ["secret", "key.pem", "cert.pem"].map { directory.path($0) },
            "the secret files, then the certificate")
        let http = try provider(
            #"{"name": "h", "source": {"type": "http", "url": "https://tokens.example/issue", "#
                + #""clientCertFile": "\#(directory.path("cert.pem"))", "clientKeyFile": "\#(directory.path("key.pem"))"}}"#
        )
        #expect(http.source.credentialFiles == ["key.pem", "cert.pem"].map { directory.path($0) })
        let pkjwt = try provider(
            #"{"name": "p", "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "#
                + #""clientID": "c", "clientAuth": "private_key_jwt", "privateKeyFile": "\#(directory.path("assertion.pem"))"}}"#
        )
        #expect(pkjwt.source.credentialFiles == [directory.path("assertion.pem")])

        for (settings, changed) in [(oauth, ["secret", "cert.pem", "key.pem"]), (pkjwt, ["assertion.pem"])] {
            for name in changed {
                let before = digest(settings)
                try directory.write(name, name + "-2")
                #expect(digest(settings) != before, "\(name) changed")
            }
        }
        let before = digest(oauth)
        try directory.write("ca.pem", "another bundle")
        #expect(digest(oauth) == before, "the CA bundle decides whom the broker trusts, not whose token it gets")
    }

    /// An inline client secret is a credential too; the digest never shows it.
    @Test func anInlineClientSecretCounts() throws {
        func oauth(_ secret: String) throws -> ProviderConfiguration {
            try provider(
                #"{"name": "o", "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "#
                    + #""clientID": "c", "clientSecret": "\#(secret)"}}"#)
        }
        let first = digest(try oauth("first-secret"))
        #expect(first != digest(try oauth("second-secret")))
        #expect(!first.contains("first-secret"))
    }

    /// A credential file that cannot be read when the provider is made (mounted later, say) names
    /// this process alone: two brokers that both could not read it would otherwise share a digest,
    /// then fetch with whatever each file comes to hold.
    @Test func anUnreadableCredentialFileSharesWithNoOtherProcess() throws {
        let directory = try TemporaryDirectory()
        let waf = try provider(
            #"{"name": "waf", "source": {"type": "http", "url": "https://tokens.example/issue", "#
                + #""headers": {"X-Api-Key": {"file": "\#(directory.path("not-yet"))"}}}}"#)
        #expect(Broker.credentialDigests(waf) == [nil])
        let unreadable = digest(waf)
        #expect(Broker.unreadableCredential.hasPrefix("unreadable:") && Broker.unreadableCredential.count > 40)
        try directory.write("not-yet", "")
        #expect(digest(waf) != unreadable, "an empty file is not an unreadable one")
    }

    /// A file source's token is this host's file: never stored, so never served from another
    /// host's record (another pod's token at the same path), nor in place of what the file holds.
    @Test func aFileSourcesTokensAreNotStored() throws {
        let file = try provider(#"{"name": "k8s", "source": {"type": "file", "path": "/var/run/secrets/tokens/t"}}"#)
        #expect(!Broker.isStored(file))
        #expect(!Broker.isStored(try provider(#"{"name": "g", "source": {"type": "jwt"}}"#)))
        #expect(Broker.isStored(try provider(#"{"name": "k", "source": {"type": "jwt", "keyFile": "/k.pem"}}"#)))
        #expect(
            Broker.isStored(
                try provider(
                    #"{"name": "o", "source": {"type": "oauth2", "tokenURL": "https://i.example/t", "#
                        + #""clientID": "c", "clientSecret": "s"}}"#)))
    }

    /// A reload compares the credential files' contents: a client certificate replaced at its
    /// path changes the provider, as a key or a secret does.
    @Test func aClientCertificateReplacedAtItsPathChangesTheProvider() throws {
        let directory = try TemporaryDirectory()
        let cert = try directory.write("cert.pem", "first certificate")
        let key = try directory.write("key.pem", "key")
        let json =
            #"{"providers": [{"name": "h", "source": {"type": "http", "url": "https://tokens.example/issue", "#
            + #""clientCertFile": "\#(cert)", "clientKeyFile": "\#(key)"}}]}"#
        func providers() throws -> [(settings: ProviderConfiguration, digests: [[UInt8]?])] {
            try configuration(json).providers.map { ($0, Broker.credentialDigests($0)) }
        }
        let before = try providers()
        #expect(Broker.compare(old: before, new: try providers()).unchanged == ["h"])
        try directory.write("cert.pem", "second certificate")
        #expect(Broker.compare(old: before, new: try providers()).changed == ["h"])
    }

    /// The store logs in to Redis with the password it read at start; a reload that finds
    /// another in the file is refused, naming it, as one that finds another store key is. The
    /// same password with or without a final newline is the same.
    @Test func anotherRedisPasswordInTheFileNeedsARestart() throws {
        let directory = try TemporaryDirectory()
        let password = try directory.write("redis-password", "first\n")
        let settings = try configuration(
            #"{"store": {"type": "redis", "address": "127.0.0.1:6379", "keyFile": "/k", "#
                + #""passwordFile": "\#(password)"}}"#)
        let first = try #require(Broker.storePasswordDigest(settings))
        try directory.write("redis-password", "first")
        #expect(Broker.storePasswordDigest(settings) == first)
        try directory.write("redis-password", "second\n")
        #expect(Broker.storePasswordDigest(settings) != first)
        #expect(Broker.storePasswordDigest(try configuration("{}")) == nil)
        #expect(
            Broker.restartNeeded(from: settings, to: settings, storePasswordChanged: true)
                == "changing store.passwordFile (the password it holds) needs a restart")
        #expect(
            Broker.restartNeeded(from: settings, to: settings, storeKeyChanged: true, storePasswordChanged: true)
                == "changing store.keyFile (the key it holds), store.passwordFile (the password it holds) needs a restart"
        )
    }
}
