import Testing
import TokenBrokerCore

/// `sinks`: token files, and what the configuration refuses about them; and proxies, which
/// need an ordinary provider.
@Suite struct SinkConfigurationTests {
    /// A configuration with an ordinary provider `plain`, a template `t` (audience and scope),
    /// and the given sinks (JSON array members) and extra top-level members.
    private func document(sinks: String, extra: String = "") -> String {
        """
        {"providers": [
           {"name": "plain"},
           {"name": "t", "perRequest": ["audience", "scope"],
            "allowedAudiences": ["https://orders.example", "https://api.example/*"], "allowedScopes": ["read", "write"]},
           {"name": "ondemand", "backgroundRefreshEnabled": false}],
         "sinks": [\(sinks)]\(extra)}
        """
    }

    private func parse(_ json: String) throws -> BrokerConfiguration {
        try BrokerConfiguration(json: Array(json.utf8))
    }

    @Test func noSinksByDefault() throws {
        #expect(try parse("{}").sinks.isEmpty)
        #expect(try parse(document(sinks: "")).sinks.isEmpty)
    }

    @Test func theIssuesExampleAndTheDefaults() throws {
        let configuration = try parse(
            document(
                sinks: """
                    {"provider": "plain", "path": "/run/token-broker/default.token", "format": "token", "mode": "0600"},
                    {"provider": "plain", "path": "/run/token-broker/default.json", "format": "json", "mode": "0640"},
                    {"provider": "plain", "path": "/run/token-broker/bare"}
                    """))
        #expect(
            configuration.sinks == [
                SinkConfiguration(
                    provider: "plain", path: "/run/token-broker/default.token", format: .token, mode: 0o600),
                SinkConfiguration(
                    provider: "plain", path: "/run/token-broker/default.json", format: .json, mode: 0o640),
                SinkConfiguration(provider: "plain", path: "/run/token-broker/bare", format: .token, mode: 0o600),
            ])
    }

    @Test func aTemplatesChildIsNamedByCheckedValues() throws {
        let configuration = try parse(
            document(
                sinks: """
                    {"provider": "t", "path": "/run/tb/orders", "audience": "https://orders.example", "scope": "write read"},
                    {"provider": "t", "path": "/run/tb/api", "audience": "https://api.example/v2"},
                    {"provider": "t", "path": "/run/tb/defaults"}
                    """))
        let template = configuration.providers[1]
        #expect(
            try configuration.sinks[0].requestValues(for: template).get()
                == TokenRequestValues(audience: "https://orders.example", scopes: ["read", "write"]))
        #expect(
            try configuration.sinks[1].requestValues(for: template).get()
                == TokenRequestValues(audience: "https://api.example/v2"))
        #expect(try configuration.sinks[2].requestValues(for: template).get() == .none)
    }

    @Test func providerAndPathAreRequired() {
        #expect(
            configurationProblem(document(sinks: #"{"path": "/run/tb/x"}"#))
                == "sinks[0].provider: is required: the name of a provider")
        #expect(
            configurationProblem(document(sinks: #"{"provider": "plain"}"#))
                == "sinks[0].path: is required: the token file, such as /run/token-broker/default.token")
    }

    @Test func theProviderMustExist() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "nope", "path": "/run/tb/x"}"#))
                == #"sinks[0].provider: no provider is named "nope"; allowed: plain, t, ondemand"#)
    }

    @Test func theProviderMustRefreshInTheBackground() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "ondemand", "path": "/run/tb/x"}"#))
                == #"sinks[0].provider: provider "ondemand" has backgroundRefreshEnabled false; a token file needs a provider that keeps its token fresh"#
        )
    }

    @Test func pathsMustNameFilesAndBeUniqueAcrossSinks() {
        for path in ["", "/run/tb/", "/run/tb/.", "/run/tb/..", "x\\u0000y"] {
            let problem = configurationProblem(document(sinks: #"{"provider": "plain", "path": "\#(path)"}"#))
            #expect(problem?.hasPrefix("sinks[0].path: ") == true, "\(path): \(problem ?? "accepted")")
        }
        #expect(
            configurationProblem(
                document(
                    sinks: #"{"provider": "plain", "path": "/run/tb/x"}, {"provider": "t", "path": "/run//tb/./x"}"#))
                == #"sinks[1].path: "/run//tb/./x" is written by another sink; allowed: one sink per file"#)
        #expect(
            configurationProblem(
                document(sinks: #"{"provider": "plain", "path": "x"}, {"provider": "plain", "path": "./x"}"#))
                == #"sinks[1].path: "./x" is written by another sink; allowed: one sink per file"#)
    }

    @Test func formatIsTokenOrJSON() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "format": "yaml"}"#))
                == #"sinks[0].format: unknown value "yaml"; allowed: token, json"#)
    }

    @Test func modesOthersCouldUseOrThatCouldRunAreRefused() {
        for mode in [
            "0644", "0666", "0604", "0700", "0610", "0777", "4600", "1600", "0000", "0200", "600x", "06000", "-600",
            "9",
        ] {
            let problem = configurationProblem(
                document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "mode": "\#(mode)"}"#))
            #expect(
                problem?.hasPrefix(
                    #"sinks[0].mode: "\#(mode)" is not a token file's mode; allowed: octal text from "0400" to "0660""#)
                    == true, "\(mode): \(problem ?? "accepted")")
        }
        for (mode, bits) in [
            ("0400", 0o400), ("0440", 0o440), ("0600", 0o600), ("0640", 0o640), ("0660", 0o660), ("640", 0o640),
            ("0040", 0o040),
        ] {
            let configuration = try? parse(
                document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "mode": "\#(mode)"}"#))
            #expect(configuration?.sinks.first?.mode == UInt32(bits), "\(mode)")
        }
    }

    @Test func unknownKeysAreRefused() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "owner": "root"}"#))?
                .hasPrefix(
                    "sinks[0].owner: unknown key; allowed: provider, path, format, mode, audience, scope, resource, "
                        + "trustDirectoryWriters")
                == true)
    }

    @Test func trustDirectoryWritersIsOffByDefaultAndOnlyABoolean() throws {
        let configuration = try parse(
            document(
                sinks: """
                    {"provider": "plain", "path": "/run/tb/a"},
                    {"provider": "plain", "path": "/run/tb/b", "trustDirectoryWriters": true},
                    {"provider": "plain", "path": "/run/tb/c", "trustDirectoryWriters": false}
                    """))
        #expect(configuration.sinks.map(\.trustDirectoryWriters) == [false, true, false])
        #expect(
            configuration.sinks[1]
                == SinkConfiguration(provider: "plain", path: "/run/tb/b", trustDirectoryWriters: true))
        for value in [#""true""#, "1", "[]", "{}"] {
            let problem = configurationProblem(
                document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "trustDirectoryWriters": \#(value)}"#))
            #expect(
                problem?.hasPrefix("sinks[0].trustDirectoryWriters: must be true or false, not ") == true,
                "\(value): \(problem ?? "accepted")")
        }
        // The key is named exactly: another spelling is an unknown key, not an opt-in.
        #expect(
            configurationProblem(
                document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "sharedDirectory": true}"#))?
                .hasPrefix("sinks[0].sharedDirectory: unknown key") == true)
    }

    @Test func valuesNeedATemplateThatTakesThemAndAllowsThem() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "plain", "path": "/run/tb/x", "audience": "a"}"#))
                == #"sinks[0].audience: applies only to a template (a provider with perRequest); "plain" is not one"#)
        #expect(
            configurationProblem(document(sinks: #"{"provider": "t", "path": "/run/tb/x", "resource": "https://r"}"#))
                == #"sinks[0].resource: provider "t" does not take "resource" per request; its perRequest: "audience", "scope""#
        )
        #expect(
            configurationProblem(
                document(sinks: #"{"provider": "t", "path": "/run/tb/x", "audience": "https://evil.example"}"#))
                == #"sinks[0].audience: is outside provider "t"'s allowedAudiences; allowed: https://orders.example, https://api.example/*"#
        )
        #expect(
            configurationProblem(document(sinks: #"{"provider": "t", "path": "/run/tb/x", "scope": "read admin"}"#))
                == #"sinks[0].scope: is outside provider "t"'s allowedScopes; allowed: read, write"#)
        #expect(
            configurationProblem(document(sinks: #"{"provider": "t", "path": "/run/tb/x", "scope": "read  write"}"#))?
                .hasPrefix("sinks[0].scope: must be scope tokens") == true)
        #expect(
            configurationProblem(
                document(sinks: #"{"provider": "t", "path": "/run/tb/x", "audience": "https://orders.example x"}"#))?
                .hasPrefix("sinks[0].audience: must be 1–1024 visible ASCII characters") == true)
        #expect(
            configurationProblem(document(sinks: #"{"provider": "t", "path": "/run/tb/x", "audience": ""}"#))?
                .hasPrefix("sinks[0].audience: must be 1–1024 visible ASCII characters") == true)
    }

    @Test func sinksMayNotNeedMoreChildrenThanTheTemplateHolds() throws {
        // Start refuses a sink whose child the template cannot hold, so the check refuses it too.
        let template =
            #"{"name": "one", "perRequest": ["audience"], "allowedAudiences": ["https://a.example/*"], "maxChildren": 1}"#
        func sinks(_ audiences: [String]) -> String {
            #"{"providers": [\#(template)], "sinks": ["#
                + audiences.enumerated().map { #"{"provider": "one", "path": "/run/tb/\#($0)", "audience": "\#($1)"}"# }
                .joined(separator: ",") + "]}"
        }
        #expect(
            configurationProblem(sinks(["https://a.example/x", "https://a.example/y"]))
                == #"sinks[1]: template "one" cannot hold another child (maxChildren 1)"#)
        // Two files of one child need one child.
        #expect(try parse(sinks(["https://a.example/x", "https://a.example/x"])).sinks.count == 2)
    }

    @Test func sinkPathsAreResolvedAgainstTheConfigurationsDirectory() throws {
        var configuration = try parse(
            document(sinks: #"{"provider": "plain", "path": "run/x.token"}, {"provider": "t", "path": "/run/y"}"#))
        configuration.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "/etc/tb/config.json"))
        #expect(configuration.sinks.map(\.path) == ["/etc/tb/run/x.token", "/run/y"])
    }

    // MARK: - Proxies

    @Test func aProxyMayNotNameATemplate() {
        let proxies = #", "proxies": [{"name": "p", "target": "https://api.example", "provider": "t"}]"#
        #expect(
            configurationProblem(document(sinks: "", extra: proxies))
                == #"proxies[0].provider: proxies need an ordinary provider; "t" is a template (perRequest)"#)
        let onPlain = #", "proxies": [{"name": "p", "target": "https://api.example", "provider": "plain"}]"#
        #expect(configurationProblem(document(sinks: "", extra: onPlain)) == nil)
    }

    @Test func aProxyWithoutProviderMayNotDefaultToATemplate() {
        let json = """
            {"providers": [{"name": "t", "perRequest": ["scope"], "allowedScopes": ["read"]}, {"name": "plain"}],
             "proxies": [{"name": "p", "target": "https://api.example"}]}
            """
        #expect(
            configurationProblem(json)
                == #"proxies[0].provider: proxies need an ordinary provider; "t" is a template (perRequest), and the first provider is the default"#
        )
    }
}
