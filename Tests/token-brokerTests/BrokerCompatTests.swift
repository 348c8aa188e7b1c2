import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import token_broker

/// What start and `--check-config` say of the cloud SDK protocols' settings: the identity header
/// file read, and a warning for a local-signer template whose tokens an SDK could get inside its margin.
@Suite struct BrokerCompatTests {
    /// A configuration whose `gcp` template (local signer) issues tokens for `lifetime` seconds,
    /// refreshed at most every `refreshDelay`, served to google-auth and msal.
    private func served(lifetime: Int, refreshDelay: Int = 300, headerFile: String? = nil) throws
        -> BrokerConfiguration
    {
        let header = headerFile.map { #", "identityHeaderFile": "\#($0)""# } ?? ""
        return try configuration(
            """
            {"providers": [{"name": "gcp", "perRequest": ["scope"], "allowedScopes": ["https://www.googleapis.com/auth/*"],
                            "tokenRefreshDelaySec": \(refreshDelay), "source": {"type": "jwt", "lifetimeSec": \(lifetime)}}],
             "compat": {"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p"},
                        "azure": {"identities": [{"provider": "gcp"}]\(header)}}}
            """)
    }

    @Test func aLifetimeThatLeavesEnoughIsNotWarnedAbout() throws {
        // 900 s refreshed every 300 s: at least 600 s left, above both margins.
        #expect(Broker.lifetimeWarnings(try served(lifetime: 900)).isEmpty)
    }

    @Test func aRefreshTooLateForAnSDKsMarginIsWarnedAboutWithTheSettingThatFixesIt() throws {
        // 1200 s refreshed every 1000 s: 200 s left at the least, under 225 (google-auth) and 300 (msal).
        let warnings = Broker.lifetimeWarnings(try served(lifetime: 1200, refreshDelay: 1000))
        #expect(warnings.count == 2)
        #expect(warnings.allSatisfy { $0.contains("200 s left") })
        #expect(warnings.contains { $0.contains("google-auth") && $0.contains("tokenRefreshDelaySec to at most 974") })
        #expect(warnings.contains { $0.contains("msal") && $0.contains("tokenRefreshDelaySec to at most 900") })
    }

    @Test func google_authsMarginItselfIsTooLittleAndMsalsIsEnough() throws {
        // 525 s refreshed every 300 s: 225 s left at the least, which google-auth treats as expired.
        let at525 = Broker.lifetimeWarnings(try served(lifetime: 525))
        #expect(at525.contains { $0.contains("google-auth") && $0.contains("tokenRefreshDelaySec to at most 299") })
        #expect(!Broker.lifetimeWarnings(try served(lifetime: 526)).contains { $0.contains("google-auth") })
        // 600 s: 300 s left at the least, which msal does not treat as expired.
        #expect(Broker.lifetimeWarnings(try served(lifetime: 600)).isEmpty)
        #expect(Broker.lifetimeWarnings(try served(lifetime: 599)).contains { $0.contains("msal") })
    }

    @Test func aLifetimeNoLongerThanTheMarginIsWarnedAbout() throws {
        let warnings = Broker.lifetimeWarnings(try served(lifetime: 240))
        // 240 s is above google-auth's 225 s, but refreshed at 85 % of it, 204 s: 36 s left.
        #expect(warnings.contains { $0.contains("google-auth") && $0.contains("36 s left") })
        #expect(warnings.contains { $0.contains("msal") && $0.contains("live 240 s, no more than the 300 s") })
    }

    @Test func aSourceThatSetsNoLifetimeIsWarnedAboutWhenItsRefreshDelayIsWithinAnSDKsMargin() throws {
        // An http source without expiresInPointer, expiresAtPointer or defaultLifetimeSec: a token
        // that is not a JWT has no expiry, and is advertised as expiring tokenRefreshDelaySec
        // after its issue.
        func served(refreshDelay: Int, lifetime: String = "") throws -> BrokerConfiguration {
            try configuration(
                """
                {"providers": [{"name": "gcp", "perRequest": ["scope"], "allowedScopes": ["https://www.googleapis.com/auth/*"],
                                "tokenRefreshDelaySec": \(refreshDelay),
                                "source": {"type": "http", "url": "http://127.0.0.1:1/token?scope={{scope}}"\(lifetime)}}],
                 "compat": {"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p"},
                            "azure": {"identities": [{"provider": "gcp"}]}}}
                """)
        }
        // The default 300 s: at msal's margin (never cached), above google-auth's.
        let warnings = Broker.lifetimeWarnings(try served(refreshDelay: 300))
        #expect(warnings.count == 1)
        #expect(warnings.first?.contains("msal") == true && warnings.first?.contains("sets no token lifetime") == true)
        #expect(Broker.lifetimeWarnings(try served(refreshDelay: 200)).count == 2)
        #expect(Broker.lifetimeWarnings(try served(refreshDelay: 900)).isEmpty)
        #expect(
            Broker.lifetimeWarnings(try served(refreshDelay: 300, lifetime: #", "defaultLifetimeSec": 3600"#)).isEmpty)
    }

    @Test func theIdentityHeaderIsReadWithoutItsLineBreakAndAnEmptyOrShortOneIsRefused() throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write("header", "s3cret-of-16-byt\n")
        #expect(
            try Broker.readIdentityHeader(try served(lifetime: 900, headerFile: path))
                == Array("s3cret-of-16-byt".utf8))
        _ = try directory.write("header", "\n")
        #expect(throws: ConfigurationError.self) {
            try Broker.readIdentityHeader(try served(lifetime: 900, headerFile: path))
        }
        _ = try directory.write("header", "s3cret-of-15-by\n")
        let error = #expect(throws: ConfigurationError.self) {
            try Broker.readIdentityHeader(try served(lifetime: 900, headerFile: path))
        }
        #expect(error?.message.contains("at least 16 bytes") == true, "\(String(describing: error))")
        #expect(error?.message.contains("s3cret") == false)
        #expect(try Broker.readIdentityHeader(try served(lifetime: 900)) == nil)
    }

    @Test(arguments: [" s3cret", "s3cret ", "s3 cret", "s3\tcret", "s\u{E9}cret", "s3cr\u{7F}t"])
    func anIdentityHeaderNoClientCanSendIsRefusedWithoutPrintingIt(secret: String) throws {
        // HTTP strips surrounding blanks, azure-identity refuses them, Python sends latin-1, and
        // the broker refuses control characters in headers: only visible ASCII can be sent.
        let directory = try TemporaryDirectory()
        let path = try directory.write("header", secret + "\n")
        let error = #expect(throws: ConfigurationError.self) {
            try Broker.readIdentityHeader(try served(lifetime: 900, headerFile: path))
        }
        #expect(error?.key == "compat.azure.identityHeaderFile")
        #expect(error?.message.contains("visible ASCII") == true)
        #expect(error?.message.contains(secret) == false && error?.message.contains("cret") == false)
    }

    @Test func protocolsOnTheTokenListenerWhileCallersHaveKeysAreWarnedAbout() throws {
        var settings = try served(lifetime: 900)
        #expect(Broker.compatWarnings(settings).isEmpty)
        settings.clientKeysFile = "/etc/token-broker/callers.json"
        let warnings = Broker.compatWarnings(settings)
        #expect(
            warnings.count == 1 && warnings[0].hasPrefix("compat.gce and compat.azure served on the token listener"))
        settings.compat.gce?.listen = try ListenAddress(parsing: "127.0.0.1:8081")
        #expect(Broker.compatWarnings(settings).first?.hasPrefix("compat.azure served on the token listener") == true)
    }

    @Test func imdsServedBesideAppServicesSecretIsWarnedAbout() throws {
        var settings = try served(lifetime: 900, headerFile: "header")
        #expect(Broker.compatWarnings(settings).isEmpty)
        settings.compat.azure?.imds = true
        let warnings = Broker.compatWarnings(settings)
        #expect(warnings.count == 1 && warnings[0].hasPrefix("compat.azure.imds is true beside an identityHeaderFile"))
    }
}
