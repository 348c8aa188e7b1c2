// The values a request may name for a template's child, checked against the template's
// perRequest and allow-lists, and the template keys of a provider's configuration.
import Testing
import TokenBrokerCore

@Suite struct TokenRequestValuesTests {
    /// A template taking the three parameters, with an exact and a prefix entry in each list.
    private let template: ProviderConfiguration = {
        var configuration = ProviderConfiguration(name: "t")
        configuration.perRequest = [.audience, .scope, .resource]
        configuration.allowedAudiences = [
            AllowPattern("https://orders.example")!, AllowPattern("https://api.example/*")!,
        ]
        configuration.allowedScopes = [AllowPattern("read")!, AllowPattern("write")!, AllowPattern("storage.*")!]
        configuration.allowedResources = [AllowPattern("urn:r:one")!, AllowPattern("https://res.example/*")!]
        return configuration
    }()

    private func check(
        audience: String? = nil, scope: String? = nil, resource: String? = nil,
        _ configuration: ProviderConfiguration? = nil
    ) -> Result<TokenRequestValues, RequestValueProblem> {
        TokenRequestValues.checked(audience: audience, scope: scope, resource: resource, for: configuration ?? template)
    }

    private func problem(_ result: Result<TokenRequestValues, RequestValueProblem>) -> RequestValueProblem? {
        if case .failure(let problem) = result { return problem }
        return nil
    }

    @Test func exactValuesAndPrefixesAreAllowedAndNothingElse() throws {
        #expect(try check(audience: "https://orders.example").get().audience == "https://orders.example")
        #expect(try check(audience: "https://api.example/v1").get().audience == "https://api.example/v1")
        #expect(try check(audience: "https://api.example/").get().audience == "https://api.example/")
        let refused = [
            "https://orders.example/", "https://orders.exampl", "https://api.example", "HTTPS://orders.example",
        ]
        for value in refused {
            #expect(
                problem(check(audience: value)) == RequestValueProblem(parameter: .audience, kind: .notAllowed),
                "\(value)")
        }
        #expect(try check(resource: "https://res.example/x").get().resource == "https://res.example/x")
        #expect(problem(check(resource: "urn:r:two")) == RequestValueProblem(parameter: .resource, kind: .notAllowed))
    }

    @Test func aPrefixEntryRefusesDotSegmentsAndBackslashesAfterItsPrefix() throws {
        // Values arrive percent-decoded: `%2e%2e/..%2Fadmin` is checked as `../../admin`.
        let refused = [
            "https://api.example/..", "https://api.example/.", "https://api.example/../admin",
            "https://api.example/./admin", "https://api.example/%2e%2e/..%2Fadmin".removingPercentTwoE,
            "https://api.example/v1/../../admin", "https://api.example/v1/./x", "https://api.example/v1/..",
            "https://api.example/v1/.", "https://api.example/v1\\..\\admin", "https://api.example/a\\b",
            "https://api.example/\\",
            // Escapes left after the query's decoding, read as a normalizing server would.
            "https://api.example/%2e%2e/x", "https://api.example/%2E%2E", "https://api.example/v1/.%2e/admin",
            "https://api.example/%2E", "https://api.example/..%2fadmin", "https://api.example/a%5Cb",
            "https://api.example/%252e%252e/x", "https://api.example/%", "https://api.example/%2",
            "https://api.example/%zz",
        ]
        for value in refused {
            #expect(
                problem(check(audience: value)) == RequestValueProblem(parameter: .audience, kind: .notAllowed),
                "\(value)")
        }
        #expect(
            problem(check(resource: "https://res.example/x/../y"))
                == RequestValueProblem(parameter: .resource, kind: .notAllowed))
        #expect(problem(check(scope: "storage..")) == RequestValueProblem(parameter: .scope, kind: .notAllowed))
        // Dots that are not whole segments are ordinary characters.
        for value in [
            "https://api.example/v1..", "https://api.example/...", "https://api.example/.well-known/x",
            "https://api.example/a..b/c", "https://api.example/v1/.x", "https://api.example/x/..y",
            "https://api.example/%2e%2ex", "https://api.example/a%20b", "https://api.example/%2E%2E%2E",
        ] {
            #expect(try check(audience: value).get().audience == value)
        }
        #expect(try check(scope: "storage.rw").get().scope == "storage.rw")
    }

    @Test func anExactEntryIsComparedAsItIsDotSegmentsAndAll() throws {
        var configuration = template
        configuration.allowedAudiences = [AllowPattern("https://odd.example/../a\\b")!]
        #expect(try check(audience: "https://odd.example/../a\\b", configuration).get().audience != nil)
        #expect(AllowPattern("https://odd.example/./x")!.matches("https://odd.example/./x"))
        #expect(!AllowPattern("https://odd.example/*")!.matches("https://odd.example/./x"))
    }

    @Test func everyScopeTokenMustBeAllowedAndTheSetIsKeptSortedWithoutRepeats() throws {
        let values = try check(scope: "write storage.rw read write").get()
        #expect(values.scopes == ["read", "storage.rw", "write"])
        #expect(values.scope == "read storage.rw write")
        #expect(try check(scope: "read write").get() == check(scope: "write read").get())
        #expect(problem(check(scope: "read admin")) == RequestValueProblem(parameter: .scope, kind: .notAllowed))
        #expect(problem(check(scope: "storage")) == RequestValueProblem(parameter: .scope, kind: .notAllowed))
    }

    @Test func valuesAreOneKeyWhenEqualAndTwoWhenTheSameTextIsAnotherParameter() throws {
        let url = "https://api.example/x"
        let keys: [TokenRequestValues] = [
            TokenRequestValues(audience: url), TokenRequestValues(resource: url),
            TokenRequestValues(scopes: [url]), TokenRequestValues(audience: url, resource: url),
            TokenRequestValues(), TokenRequestValues(scopes: []),
        ]
        #expect(Set(keys).count == keys.count)
        var children: [TokenRequestValues: Int] = [:]
        for (index, key) in keys.enumerated() { children[key] = index }
        // Made again, from other strings and in another order: the same keys.
        #expect(children[TokenRequestValues(audience: "https://api.example/" + "x")] == 0)
        #expect(children[TokenRequestValues(scopes: [String(url.reversed().reversed())])] == 2)
        #expect(TokenRequestValues(scopes: ["b", "a", "b"]) == TokenRequestValues(scopes: ["a", "b"]))
        #expect(TokenRequestValues(scopes: ["b", "a"]).hashValue == TokenRequestValues(scopes: ["a", "b"]).hashValue)
        #expect(TokenRequestValues(audience: "a") != TokenRequestValues(audience: "b"))
    }

    @Test func malformedValuesAreRefusedBeforeTheAllowList() {
        let malformed = RequestValueProblem(parameter: .scope, kind: .malformed)
        // Empty, doubled, leading and trailing spaces; NQCHAR excludes " and \; control characters.
        for scope in ["", "read  write", " read", "read ", "re\"ad", "read\\", "read\twrite", "read\u{7F}", "réad"] {
            #expect(problem(check(scope: scope)) == malformed, "\(scope.debugDescription)")
        }
        for audience in ["", "https://api.example/a b", "https://api.example/\u{0}", "https://api.example/é"] {
            #expect(
                problem(check(audience: audience)) == RequestValueProblem(parameter: .audience, kind: .malformed),
                "\(audience.debugDescription)")
        }
        let long = "https://api.example/" + String(repeating: "a", count: TokenRequestValues.maximumLength)
        #expect(problem(check(audience: long)) == RequestValueProblem(parameter: .audience, kind: .malformed))
        let longest = "https://api.example/" + String(repeating: "a", count: TokenRequestValues.maximumLength - 20)
        #expect((try? check(audience: longest).get()) != nil, "exactly maximumLength bytes")
        #expect(problem(check(resource: "")) == RequestValueProblem(parameter: .resource, kind: .malformed))
    }

    @Test func aParameterNotInPerRequestIsNotAcceptedWhateverItsValue() {
        var audienceOnly = template
        audienceOnly.perRequest = [.audience]
        #expect(
            problem(check(scope: "read", audienceOnly)) == RequestValueProblem(parameter: .scope, kind: .notAccepted))
        #expect(problem(check(scope: "", audienceOnly)) == RequestValueProblem(parameter: .scope, kind: .notAccepted))
        let ordinary = ProviderConfiguration(name: "plain")
        #expect(
            problem(check(audience: "https://orders.example", ordinary))
                == RequestValueProblem(parameter: .audience, kind: .notAccepted))
        #expect(
            problem(check(resource: "urn:r:one", ordinary))
                == RequestValueProblem(parameter: .resource, kind: .notAccepted))
    }

    @Test func noValueIsTheTemplatesDefaultChild() throws {
        #expect(try check().get() == .none)
        #expect(TokenRequestValues.none.description == "defaults")
        let values = try check(audience: "https://orders.example", scope: "write read").get()
        #expect(values.description == #"audience="https://orders.example" scope="read write""#)
    }

    @Test func allowPatternsAreExactOrATrailingStarPrefix() {
        #expect(AllowPattern("*") == nil, "a lone * allows everything")
        #expect(AllowPattern("") == nil)
        #expect(AllowPattern("a*b") == nil && AllowPattern("a**") == nil && AllowPattern("*a") == nil)
        #expect(AllowPattern("a b") == nil && AllowPattern("a\u{1}") == nil)
        #expect(AllowPattern("https://a.example/*")?.isPrefix == true)
        #expect(AllowPattern("https://a.example/*")?.description == "https://a.example/*")
        #expect(AllowPattern("read")?.matches("read") == true && AllowPattern("read")?.matches("reader") == false)
    }

    // MARK: Configuration keys

    @Test func aTemplateIsReadWithItsAllowListsAndBounds() throws {
        let configuration = try BrokerConfiguration(
            json: Array(
                #"""
                {"providers": [{"name": "orders", "perRequest": ["audience", "scope"],
                  "allowedAudiences": ["https://orders.example", "https://api.example/*"],
                  "allowedScopes": ["read", "write"], "maxChildren": 10000, "childIdleSec": 60}]}
                """#.utf8))
        let provider = configuration.providers[0]
        #expect(provider.isTemplate && provider.perRequest == [.audience, .scope])
        #expect(provider.allowedAudiences.map(\.description) == ["https://orders.example", "https://api.example/*"])
        #expect(provider.allowedScopes.map(\.description) == ["read", "write"])
        #expect(provider.maxChildren == 10000 && provider.childIdleSec == 60)
        let defaults = try BrokerConfiguration(
            json: Array(
                #"""
                {"providers": [{"perRequest": ["resource"], "allowedResources": ["urn:x"],
                  "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "c",
                             "clientSecret": "s"}}]}
                """#.utf8))
        #expect(defaults.providers[0].maxChildren == 100 && defaults.providers[0].childIdleSec == 3600)
        #expect(try BrokerConfiguration(json: Array("{}".utf8)).providers[0].isTemplate == false)
    }

    @Test func templateKeysAreRefusedWithTheReason() {
        func problem(_ provider: String) -> String? {
            configurationProblem(#"{"providers": [{"name": "t", "# + provider + "}]}")
        }
        #expect(
            problem(#""perRequest": ["audience"]"#)
                == #"providers[0].allowedAudiences: is required when perRequest has "audience": list the values a request may name"#
        )
        #expect(
            problem(#""allowedScopes": ["read"]"#)
                == #"providers[0].allowedScopes: only applies when perRequest has "scope""#)
        #expect(
            problem(#""perRequest": ["audience"], "allowedAudiences": ["a"], "allowedScopes": ["read"]"#)
                == #"providers[0].allowedScopes: only applies when perRequest has "scope""#)
        #expect(problem(#""perRequest": []"#)?.hasPrefix("providers[0].perRequest: must name at least one") == true)
        #expect(problem(#""perRequest": ["aud"]"#)?.hasPrefix("providers[0].perRequest[0]: must be one of") == true)
        #expect(
            problem(#""perRequest": ["scope", "scope"], "allowedScopes": ["a"]"#)
                == #"providers[0].perRequest[1]: "scope" is listed twice"#)
        #expect(
            problem(#""perRequest": ["audience"], "allowedAudiences": ["*"]"#)?.hasPrefix(
                "providers[0].allowedAudiences[0]: must be a value, or a prefix ending in *") == true)
        #expect(
            problem(#""perRequest": ["audience"], "allowedAudiences": []"#)
                == "providers[0].allowedAudiences: must list at least one value")
        #expect(
            problem(#""perRequest": ["audience"], "allowedAudiences": [3]"#)?.hasPrefix(
                "providers[0].allowedAudiences[0]: must be a value") == true)
        let template = #""perRequest": ["audience"], "allowedAudiences": ["a"], "#
        #expect(
            problem(template + #""maxChildren": 0"#) == "providers[0].maxChildren: 0 is out of range; allowed: 1–10000")
        #expect(
            problem(template + #""maxChildren": 10001"#)
                == "providers[0].maxChildren: 10001 is out of range; allowed: 1–10000")
        #expect(
            problem(template + #""childIdleSec": 59"#)
                == "providers[0].childIdleSec: 59 is out of range; allowed: 60–86400")
        #expect(
            problem(template + #""childIdleSec": 86401"#)
                == "providers[0].childIdleSec: 86401 is out of range; allowed: 60–86400")
        #expect(
            problem(#""maxChildren": 5"#)
                == "providers[0].maxChildren: only applies to a template (a provider with perRequest)")
        #expect(
            problem(#""childIdleSec": 60"#)
                == "providers[0].childIdleSec: only applies to a template (a provider with perRequest)")
        #expect(
            problem(template + #""source": {"type": "file", "path": "/tmp/t"}"#)
                == "providers[0].perRequest: a file source cannot make tokens per audience, scope or resource")
        #expect(
            problem(template + #""allowedAudience": ["b"]"#)?.hasPrefix("providers[0].allowedAudience: unknown key")
                == true)
    }
}

extension String {
    /// The text with `%2e`/`%2E` and `%2F`/`%2f` decoded, as the server decodes a query value.
    fileprivate var removingPercentTwoE: String {
        var out = ""
        var rest = Substring(self)
        while let first = rest.first {
            let next = rest.prefix(3).lowercased()
            if next == "%2e" || next == "%2f" {
                out.append(next == "%2e" ? "." : "/")
                rest = rest.dropFirst(3)
            } else {
                out.append(first)
                rest = rest.dropFirst()
            }
        }
        return out
    }
}
