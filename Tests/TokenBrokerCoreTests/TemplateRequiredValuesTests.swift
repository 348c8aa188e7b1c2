// The values an http template's placeholders need: they have no configured default, so every
// request, and every sink, on such a template must name them; oauth2 and jwt templates have
// their configured values as defaults and need none.
import Testing
import TokenBrokerCore

@Suite struct TemplateRequiredValuesTests {
    /// An http template `custom` whose URL uses the audience and whose body uses the scope, an
    /// oauth2 template `orders` taking the same parameters, and the given sinks.
    private func document(sinks: String) -> String {
        """
        {"providers": [
           {"name": "custom", "perRequest": ["audience", "scope"],
            "allowedAudiences": ["https://orders.example"], "allowedScopes": ["read", "write"],
            "source": {"type": "http", "url": "https://tokens.example/issue?aud={{audience}}",
                       "body": "scope={{scope}}"}},
           {"name": "orders", "perRequest": ["audience", "scope"],
            "allowedAudiences": ["https://orders.example"], "allowedScopes": ["read", "write"],
            "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "c",
                       "clientSecret": "s", "audience": "https://default.example"}}],
         "sinks": [\(sinks)]}
        """
    }

    @Test func aSinkOnAnHTTPTemplateMustNameEveryValueItsPlaceholdersUse() {
        #expect(
            configurationProblem(document(sinks: #"{"provider": "custom", "path": "/run/tb/a", "scope": "read"}"#))
                == #"sinks[0].audience: is required by provider "custom" (its source's placeholders use it, and it has no default)"#
        )
        #expect(
            configurationProblem(
                document(sinks: #"{"provider": "custom", "path": "/run/tb/a", "audience": "https://orders.example"}"#))
                == #"sinks[0].scope: is required by provider "custom" (its source's placeholders use it, and it has no default)"#
        )
        #expect(
            configurationProblem(document(sinks: #"{"provider": "custom", "path": "/run/tb/a"}"#))?
                .hasPrefix("sinks[0].audience: is required") == true)
        #expect(
            configurationProblem(
                document(
                    sinks: #"""
                        {"provider": "custom", "path": "/run/tb/a", "audience": "https://orders.example", "scope": "read"}
                        """#)) == nil)
    }

    @Test func aSinkOnAnOAuth2TemplateMayLeaveValuesToTheConfiguredDefaults() {
        #expect(configurationProblem(document(sinks: #"{"provider": "orders", "path": "/run/tb/a"}"#)) == nil)
        #expect(
            configurationProblem(document(sinks: #"{"provider": "orders", "path": "/run/tb/a", "scope": "read"}"#))
                == nil)
    }

    @Test func theRequiredParametersAreThoseOfAnHTTPSourcesPlaceholders() throws {
        let configuration = try BrokerConfiguration(json: Array(document(sinks: "").utf8))
        #expect(configuration.providers[0].requiredParameters == [.audience, .scope])
        #expect(configuration.providers[1].requiredParameters.isEmpty)
        var headerOnly = HTTPSourceConfiguration(url: "https://tokens.example/issue")
        headerOnly.headers = ["X-Resource": .value("{{resource}}"), "X-Fixed": .value("v")]
        #expect(ProviderConfiguration(name: "h", source: .http(headerOnly)).requiredParameters == [.resource])
        #expect(ProviderConfiguration(name: "j").requiredParameters.isEmpty)
        // Kept in step with the source when it changes.
        var changed = ProviderConfiguration(name: "c")
        changed.source = .http(HTTPSourceConfiguration(url: "https://tokens.example/{{scope}}"))
        #expect(changed.requiredParameters == [.scope])
    }

    @Test func aRequestWithoutARequiredValueIsRefusedNamingIt() throws {
        let configuration = try BrokerConfiguration(json: Array(document(sinks: "").utf8)).providers[0]
        func problem(_ audience: String?, _ scope: String?) -> RequestValueProblem? {
            if case .failure(let problem) = TokenRequestValues.checked(
                audience: audience, scope: scope, resource: nil, for: configuration)
            {
                return problem
            }
            return nil
        }
        #expect(problem(nil, nil) == RequestValueProblem(parameter: .audience, kind: .missing))
        #expect(problem(nil, "read") == RequestValueProblem(parameter: .audience, kind: .missing))
        #expect(problem("https://orders.example", nil) == RequestValueProblem(parameter: .scope, kind: .missing))
        // A value given but refused is reported as such, before a missing one.
        #expect(problem("https://evil.example", nil) == RequestValueProblem(parameter: .audience, kind: .notAllowed))
        #expect(problem("https://orders.example", "read") == nil)
    }
}
