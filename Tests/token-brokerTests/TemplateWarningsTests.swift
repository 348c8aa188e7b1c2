import Testing
import TokenBrokerCore

@testable import token_broker

/// What start and `--check-config` say of a template that callers without a secret can fill:
/// the combinations of values its allow-lists admit on the routes that take no secret, counted
/// against its `maxChildren`.
@Suite struct TemplateWarningsTests {
    /// A configuration of `providers` (a JSON array), with `compat` (a JSON object, or none) and
    /// caller keys when `keys`.
    private func settings(_ providers: String, compat: String? = nil, keys: Bool = false) throws
        -> BrokerConfiguration
    {
        var settings = try configuration(
            #"{"providers": \#(providers)\#(compat.map { #", "compat": \#($0)"# } ?? "")}"#)
        if keys { settings.clientKeysFile = "/etc/token-broker/callers.json" }
        return settings
    }

    /// A local-signer template taking `parameters` (a JSON array), with `allowed` (JSON members)
    /// and `maxChildren`.
    private func template(_ name: String, _ parameters: String, _ allowed: String, maxChildren: Int = 100) -> String {
        #"""
        {"name": "\#(name)", "perRequest": \#(parameters), \#(allowed), "maxChildren": \#(maxChildren),
         "childIdleSec": 600, "source": {"type": "jwt"}}
        """#
    }

    private func patterns(_ written: [String]) -> [AllowPattern] { written.compactMap(AllowPattern.init) }

    /// `count` exact scope tokens, as `allowedScopes`' JSON array.
    private func scopes(_ count: Int) -> String {
        "[" + (0..<count).map { #""scope\#($0)""# }.joined(separator: ", ") + "]"
    }

    // MARK: - Counting

    @Test func aPrefixEntryAdmitsUnboundedlyManyAndExactEntriesCountOnce() {
        #expect(Broker.Combinations.values(patterns(["https://a.example", "https://b.example/*"])) == .unbounded)
        #expect(Broker.Combinations.scopeSets(patterns(["read", "api/*"])) == .unbounded)
        #expect(Broker.Combinations.values(patterns(["https://a.example", "https://a.example"])) == .count(1))
        #expect(Broker.Combinations.values(patterns(["a", "b", "c"])) == .count(3))
    }

    @Test func nScopeTokensMakeTwoToTheNMinusOneSets() {
        // A scope is a set: no empty one (refused), and order and repeats make no other child.
        #expect(Broker.Combinations.scopeSets(patterns(["read"])) == .count(1))
        #expect(Broker.Combinations.scopeSets(patterns(["read", "write", "api"])) == .count(7))
        #expect(Broker.Combinations.scopeSets(patterns(["read", "write", "read"])) == .count(3))
        let sixtyTwo = patterns((0..<62).map { "s\($0)" })
        #expect(Broker.Combinations.scopeSets(sixtyTwo) == .count((1 << 62) - 1))
    }

    @Test func hugeCountsSaturateAtIntMaxWithoutTrapping() {
        // 2^63 − 1 is Int.max itself; 2^64 − 1 and 2^200 − 1 stay there.
        for tokens in [63, 64, 200] {
            #expect(Broker.Combinations.scopeSets(patterns((0..<tokens).map { "s\($0)" })) == .count(.max))
        }
        #expect(Broker.Combinations.count(.max / 2 + 1) * .count(2) == .count(.max))
        #expect(Broker.Combinations.count(.max) * .count(.max) == .count(.max))
        #expect(Broker.Combinations.count(.max) + .count(1) == .count(.max))
        #expect(Broker.Combinations.count(3) * .count(8) == .count(24))
        #expect(Broker.Combinations.count(0) * .unbounded == .count(0))
        #expect(Broker.Combinations.count(2) + .unbounded == .unbounded)
        #expect(Broker.Combinations.count(.max).description == "at least 9223372036854775807")
        #expect(Broker.Combinations.unbounded.description == "unboundedly many")
        #expect(Broker.Combinations.count(.max).exceeds(10_000) && Broker.Combinations.unbounded.exceeds(10_000))
        #expect(!Broker.Combinations.count(100).exceeds(100) && Broker.Combinations.count(101).exceeds(100))
    }

    // MARK: - The token listener without caller keys

    @Test func withoutCallerKeysTheTokenListenersCombinationsAreAProductCountingTheDefaults() throws {
        // Audience: 2 values or none (the default); scope: 7 sets or none. (2 + 1) × (7 + 1) = 24.
        func apis(maxChildren: Int) -> String {
            template(
                "apis", #"["audience", "scope"]"#,
                #""allowedAudiences": ["https://a.example", "https://b.example"], "allowedScopes": ["r", "w", "x"]"#,
                maxChildren: maxChildren)
        }
        #expect(Broker.templateWarnings(try settings("[\(apis(maxChildren: 24))]")).isEmpty)
        let warnings = Broker.templateWarnings(try settings("[\(apis(maxChildren: 23))]"))
        #expect(warnings.count == 1)
        let warning = try #require(warnings.first)
        #expect(warning.hasPrefix(#"template "apis": its allow-lists admit 24 combinations of values, more than"#))
        #expect(warning.contains("more than its maxChildren (23)"))
        #expect(
            warning.contains(
                "on routes that take no secret: the token listener's routes (no clientKeysFile; a request there"))
        #expect(warning.contains("503 too_many_children for up to childIdleSec (600 s)"))
        #expect(warning.contains("Allow exact values only, few enough combinations to fit (n scope tokens make"))
        #expect(warning.hasSuffix("or raise maxChildren, or give callers keys (clientKeysFile)"))
    }

    @Test func aParameterTheSourceNeedsHasNoDefaultChild() throws {
        // {{audience}} in the http source's URL: every request names one of the 3 audiences.
        func http(maxChildren: Int) throws -> BrokerConfiguration {
            try settings(
                #"""
                [{"name": "http", "perRequest": ["audience"], "maxChildren": \#(maxChildren),
                  "allowedAudiences": ["https://a.example", "https://b.example", "https://c.example"],
                  "source": {"type": "http", "url": "http://127.0.0.1:1/token?aud={{audience}}"}}]
                """#)
        }
        #expect(Broker.templateWarnings(try http(maxChildren: 3)).isEmpty)
        let warning = try #require(Broker.templateWarnings(try http(maxChildren: 2)).first)
        #expect(warning.contains("admit 3 combinations") && warning.contains("(no clientKeysFile). Any client"))
    }

    @Test func aPrefixOrTooManyScopesIsNamedAndHugeCountsAreSaidAsAtLeast() throws {
        let prefixed = Broker.templateWarnings(
            try settings(
                "[\(template("orders", #"["audience"]"#, #""allowedAudiences": ["https://orders.example/*"]"#))]"))
        #expect(prefixed.count == 1)
        #expect(
            prefixed.first?.hasPrefix(
                #"template "orders": its allow-lists admit unboundedly many combinations of values (a prefix entry,"#
                    + " ending in *, in allowedAudiences), more than its maxChildren (100)") == true)
        #expect(prefixed.first?.contains("n scope tokens") == false)
        // 70 scope tokens: 2^70 sets with the default, past Int.max; times 2 audiences, still there.
        let allowed = #""allowedAudiences": ["a", "b"], "allowedScopes": \#(scopes(70))"#
        let huge = Broker.templateWarnings(try settings("[\(template("many", #"["audience", "scope"]"#, allowed))]"))
        #expect(huge.first?.contains("admit at least 9223372036854775807 combinations") == true)
    }

    // MARK: - Who can reach a template without a secret

    @Test func aTemplateReachedOnlyWithACallerKeyIsNotWarnedAbout() throws {
        let providers =
            "[\(template("orders", #"["audience"]"#, #""allowedAudiences": ["https://orders.example/*"]"#))]"
        #expect(!Broker.templateWarnings(try settings(providers)).isEmpty)
        #expect(Broker.templateWarnings(try settings(providers, keys: true)).isEmpty)
    }

    @Test func withCallerKeysGCEsTokenRouteCountsItsScopeSetsAlone() throws {
        // 7 scope tokens: 127 sets. GCE always names a set (its configured scopes when the request
        // names none) and never an audience, so neither default child counts.
        func gcp(maxChildren: Int) throws -> BrokerConfiguration {
            let allowed = #""allowedAudiences": ["https://a.example/*"], "allowedScopes": \#(scopes(7))"#
            let gce = #""provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p", "scopes": ["scope0"]"#
            return try settings(
                "[\(template("gcp", #"["audience", "scope"]"#, allowed, maxChildren: maxChildren))]",
                compat: #"{"gce": {\#(gce)}}"#, keys: true)
        }
        #expect(Broker.templateWarnings(try gcp(maxChildren: 127)).isEmpty)
        let warnings = Broker.templateWarnings(try gcp(maxChildren: 126))
        #expect(warnings.count == 1)
        #expect(warnings.first?.contains("admit 127 combinations of values, more than its maxChildren (126)") == true)
        #expect(warnings.first?.contains("on routes that take no secret: compat.gce's token route. Any client") == true)
        #expect(warnings.first?.contains("give callers keys") == false)
        // Without caller keys the token listener adds the audiences, a prefix, and the defaults.
        var open = try gcp(maxChildren: 126)
        open.clientKeysFile = nil
        let opened = try #require(Broker.templateWarnings(open).first)
        #expect(
            opened.contains(
                "admit unboundedly many combinations of values (a prefix entry, ending in *, in allowedAudiences)"))
        #expect(opened.contains("for the template's default) and compat.gce's token route. Any client"))
    }

    @Test func gcesIdentityRouteIsWarnedAboutWithCallerKeys() throws {
        let warnings = Broker.templateWarnings(
            try settings(
                """
                [\(template("gcp", #"["scope"]"#, #""allowedScopes": ["read"]"#)),
                 \(template("gcp-id", #"["audience"]"#, #""allowedAudiences": ["https://run.example/*"]"#))]
                """,
                compat: #"""
                    {"gce": {"provider": "gcp", "identityProvider": "gcp-id", "projectId": "p",
                             "serviceAccountEmail": "a@p", "scopes": ["read"]}}
                    """#,
                keys: true))
        #expect(warnings.count == 1)
        #expect(warnings.first?.hasPrefix(#"template "gcp-id": its allow-lists admit unboundedly many"#) == true)
        #expect(warnings.first?.contains("no secret: compat.gce's identity route.") == true)
    }

    @Test func azureIsWarnedAboutWhenIMDSIsServedAndNotBehindAppServicesSecretAlone() throws {
        // By scope: IMDS asks `R/.default`, so only the exact entries ending so count (2 of 3).
        func azure(_ options: String, maxChildren: Int = 1) throws -> BrokerConfiguration {
            let allowed = #"""
                "allowedScopes": ["https://vault.azure.net/.default", "https://storage.azure.com/.default", "read"]
                """#
            return try settings(
                "[\(template("azure", #"["scope"]"#, allowed, maxChildren: maxChildren))]",
                compat: #"{"azure": {"identities": [{"provider": "azure"}]\#(options)}}"#, keys: true)
        }
        let warnings = Broker.templateWarnings(try azure(""))
        #expect(warnings.count == 1)
        #expect(warnings.first?.contains("admit 2 combinations") == true)
        #expect(warnings.first?.contains("no secret: compat.azure's IMDS route.") == true)
        #expect(Broker.templateWarnings(try azure("", maxChildren: 2)).isEmpty)
        // App Service's route wants its secret; IMDS beside it only when asked for.
        #expect(Broker.templateWarnings(try azure(#", "identityHeaderFile": "header""#)).isEmpty)
        #expect(Broker.templateWarnings(try azure(#", "identityHeaderFile": "header", "imds": true"#)).count == 1)
    }

    @Test func azureByResourceCountsTheResources() throws {
        let warnings = Broker.templateWarnings(
            try settings(
                #"""
                [{"name": "azure", "perRequest": ["resource"], "maxChildren": 1,
                  "allowedResources": ["https://vault.azure.net", "https://management.azure.com"],
                  "source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:1/token", "clientID": "c",
                             "clientSecretFile": "/run/secrets/azure"}}]
                """#,
                compat: #"{"azure": {"identities": [{"provider": "azure"}]}}"#, keys: true))
        #expect(warnings.count == 1 && warnings[0].contains("admit 2 combinations"))
    }
}
