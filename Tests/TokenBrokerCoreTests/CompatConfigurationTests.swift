// `compat`: the cloud SDK protocols' settings, read and checked against the templates they name.
import Testing
import TokenBrokerCore

@Suite struct CompatConfigurationTests {
    /// Templates as a compatibility configuration needs them, and `compat` as given.
    private func document(_ compat: String, listen: String = "127.0.0.1:8080") -> String {
        """
        {"listen": "\(listen)", "providers": [
          {"name": "gcp", "perRequest": ["scope"], "allowedScopes": ["https://www.googleapis.com/auth/*"]},
          {"name": "gcp-id", "perRequest": ["audience"], "allowedAudiences": ["https://svc.example/*"]},
          {"name": "storage", "perRequest": ["resource"], "allowedResources": ["https://storage.example/*"],
           "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "c", "clientSecret": "s"}},
          {"name": "both", "perRequest": ["scope", "audience"], "allowedScopes": ["https://www.googleapis.com/auth/*"],
           "allowedAudiences": ["https://svc.example/*"],
           "source": {"type": "http", "url": "https://issuer.example/token?aud={{audience}}&scope={{scope}}"}},
          {"name": "plain"}],
         "compat": \(compat)}
        """
    }

    @Test func bothProtocolsAreReadWithTheirDefaults() throws {
        let configuration = try BrokerConfiguration(
            json: Array(
                document(
                    """
                    {"gce": {"provider": "gcp", "identityProvider": "gcp-id", "projectId": "p-1",
                             "numericProjectId": "1234", "serviceAccountEmail": "a@p-1.example"},
                     "azure": {"identities": [{"provider": "storage"},
                                              {"provider": "gcp", "clientId": "c-2", "resourceId": "/sub/x"}],
                               "identityHeaderFile": "header", "listen": "127.0.0.1:8082"}}
                    """
                ).utf8))
        let gce = try #require(configuration.compat.gce)
        #expect(gce.provider == "gcp" && gce.identityProvider == "gcp-id" && gce.numericProjectId == "1234")
        #expect(gce.scopes == [GCEConfiguration.cloudPlatformScope] && gce.listen == nil && gce.universeDomain == nil)
        let azure = try #require(configuration.compat.azure)
        #expect(azure.identities.map(\.isSystemAssigned) == [true, false])
        #expect(azure.identities[1].clientId == "c-2" && azure.identities[1].resourceId == "/sub/x")
        #expect(azure.listen?.description == "127.0.0.1:8082")
        // With App Service's secret, IMDS (which has none) is served only when asked for.
        #expect(!azure.servesIMDS)
        #expect(AzureConfiguration(identities: azure.identities).servesIMDS)
        #expect(AzureConfiguration(identities: azure.identities, identityHeaderFile: "h", imds: true).servesIMDS)
        var resolved = configuration
        resolved.resolvePaths(relativeTo: "/etc/tb")
        #expect(resolved.compat.azure?.identityHeaderFile == "/etc/tb/header")
        #expect(try BrokerConfiguration(json: Array("{}".utf8)).compat.isEmpty)
    }

    @Test(arguments: [
        (#"{"gce": {"provider": "gcp", "projectId": "p"}}"#, "compat.gce.serviceAccountEmail: is required"),
        (
            #"{"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p", "zone": "x"}}"#,
            "compat.gce.zone: unknown key"
        ),
        (#"{"aws": {}}"#, "compat.aws: unknown key"),
        (
            #"{"gce": {"provider": "plain", "projectId": "p", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.provider: provider \"plain\" must be a template whose perRequest has \"scope\""
        ),
        (
            #"{"gce": {"provider": "nobody", "projectId": "p", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.provider: no provider is named \"nobody\""
        ),
        (
            #"{"gce": {"provider": "gcp", "identityProvider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.identityProvider: provider \"gcp\" must be a template whose perRequest has \"audience\""
        ),
        (
            #"{"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p", "scopes": ["openid"]}}"#,
            "compat.gce.scopes: must be scopes provider \"gcp\" allows"
        ),
        (
            #"{"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p", "numericProjectId": "12a"}}"#,
            "compat.gce.numericProjectId: must be 1–20 digits"
        ),
        (
            #"{"gce": {"provider": "gcp", "projectId": "my project", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.projectId: must be 1–1024 visible ASCII characters"
        ),
        // A placeholder the protocol never fills: every request would be refused.
        (
            #"{"gce": {"provider": "both", "projectId": "p", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.provider: provider \"both\"'s source needs {{audience}} in every request, which this protocol never sends (it sends scope only)"
        ),
        (
            #"{"gce": {"provider": "gcp", "identityProvider": "both", "projectId": "p", "serviceAccountEmail": "a@p"}}"#,
            "compat.gce.identityProvider: provider \"both\"'s source needs {{scope}} in every request"
        ),
        (
            #"{"azure": {"identities": [{"provider": "both"}]}}"#,
            "compat.azure.identities[0].provider: provider \"both\"'s source needs {{audience}} in every request"
        ),
        (#"{"azure": {"identities": []}}"#, "compat.azure.identities: must list at least one identity"),
        (
            #"{"azure": {"identities": [{"provider": "storage"}, {"provider": "gcp"}]}}"#,
            "compat.azure.identities[1]: a second identity without clientId"
        ),
        (
            #"{"azure": {"identities": [{"provider": "storage", "clientId": "x"}, {"provider": "gcp", "clientId": "x"}]}}"#,
            "compat.azure.identities[1].clientId: names an identity already listed"
        ),
        (
            // Requests name identities in any case: "abc" would reach the first only.
            #"{"azure": {"identities": [{"provider": "storage", "clientId": "AbC"}, {"provider": "gcp", "clientId": "abc"}]}}"#,
            "compat.azure.identities[1].clientId: names an identity already listed"
        ),
        (
            #"{"azure": {"identities": [{"provider": "storage", "resourceId": "/subscriptions/0/RG"}, {"provider": "gcp", "resourceId": "/SUBSCRIPTIONS/0/rg"}]}}"#,
            "compat.azure.identities[1].resourceId: names an identity already listed"
        ),
        (
            #"{"azure": {"identities": [{"provider": "gcp-id"}]}}"#,
            "compat.azure.identities[0].provider: provider \"gcp-id\" must be a template whose perRequest has \"resource\" or \"scope\""
        ),
        (
            #"{"azure": {"identities": [{"provider": "storage"}], "listen": "127.0.0.1:8080"}}"#,
            "compat.azure.listen: 127.0.0.1:8080 is also listen"
        ),
        (
            // The protocols' own listeners are checked against the broker's for overlap too.
            #"{"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p", "listen": "0.0.0.0:8080"}}"#,
            "compat.gce.listen: 0.0.0.0:8080 overlaps listen 127.0.0.1:8080: 0.0.0.0 takes port 8080"
        ),
        (
            #"{"azure": {"identities": [{"provider": "storage"}], "imds": false}}"#,
            "compat.azure.imds: is false and there is no identityHeaderFile"
        ),
        (
            #"{"azure": {"identities": [{"provider": "storage"}], "imds": "yes"}}"#,
            "compat.azure.imds: must be true or false"
        ),
    ])
    func mistakesNameTheKey(compat: String, problem: String) {
        let message = configurationProblem(document(compat))
        #expect(message?.hasPrefix(problem) == true, "\(message ?? "accepted")")
    }
}
