import Testing
import TokenBrokerCore

/// What a template's source may be asked at start: the local signer refuses `resource`, an
/// `oauth2` source's `extraParams` cannot repeat a per-request parameter, and an `http` source's
/// placeholders (`{{audience}}`, `{{scope}}`, `{{resource}}`) must be known, well formed, and
/// named by the provider's `perRequest`.
@Suite struct TemplateSourceConfigurationTests {
    /// A one-provider configuration: `template` holds the provider's keys other than `source`.
    private func provider(_ template: String, source: String) -> String {
        #"{"providers": [{"name": "t", "source": \#(source)\#(template.isEmpty ? "" : ", " + template)}]}"#
    }

    private let allTemplateKeys = #"""
        "perRequest": ["audience", "scope", "resource"], "allowedAudiences": ["https://*"],
        "allowedScopes": ["read", "write"], "allowedResources": ["https://*"]
        """#

    private let audienceAndScope = #"""
        "perRequest": ["audience", "scope"], "allowedAudiences": ["https://*"], "allowedScopes": ["read"]
        """#

    private func http(url: String = "https://issuer.example/token", headers: String = "{}", body: String? = nil)
        -> String
    {
        let bodyMember = body.map { #", "body": "# + JSONText.quoted($0) } ?? ""
        return #"{"type": "http", "url": \#(JSONText.quoted(url)), "headers": \#(headers)\#(bodyMember)}"#
    }

    // MARK: - the local signer

    @Test func theLocalSignerRefusesResourceNamingTheKey() {
        let message = configurationProblem(
            provider(
                #""perRequest": ["audience", "resource"], "allowedAudiences": ["a"], "allowedResources": ["r"]"#,
                source: #"{"type": "jwt"}"#))
        #expect(message?.hasPrefix("providers[0].perRequest: the local signer (source type \"jwt\") cannot") == true)
        #expect(message?.contains("resource") == true)
    }

    @Test func theDefaultSourceIsTheLocalSignerAndRefusesResourceToo() {
        let message = configurationProblem(
            #"{"providers": [{"perRequest": ["resource"], "allowedResources": ["https://r.example"]}]}"#)
        #expect(message?.hasPrefix("providers[0].perRequest: the local signer") == true)
    }

    @Test func theLocalSignerTakesAudienceAndScope() throws {
        let configuration = try BrokerConfiguration(
            json: Array(provider(audienceAndScope, source: #"{"type": "jwt"}"#).utf8))
        #expect(configuration.providers[0].perRequest == [.audience, .scope])
    }

    // MARK: - oauth2

    private let oauth2 = #"""
        {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "c", "clientSecret": "s",
         "extraParams": {"audience": "https://fixed.example", "foo": "bar"}}
        """#

    @Test func anExtraParamThatIsNamedPerRequestIsRefused() {
        #expect(
            configurationProblem(provider(audienceAndScope, source: oauth2))
                == "providers[0].source.extraParams.audience: \"audience\" is named per request (perRequest);"
                + " give its default as source.audience")
    }

    @Test func anExtraParamNotNamedPerRequestIsFine() {
        let scopeOnly = #""perRequest": ["scope"], "allowedScopes": ["read"]"#
        #expect(configurationProblem(provider(scopeOnly, source: oauth2)) == nil)
        #expect(configurationProblem(provider("", source: oauth2)) == nil, "a provider that is no template")
    }

    // MARK: - http placeholders

    @Test func placeholdersInURLHeaderValuesAndBodyAreAccepted() throws {
        let source = http(
            url: "https://issuer.example/t/{{resource}}?aud={{audience}}#{{scope}}",
            headers: #"{"X-Scope": "{{scope}}", "Authorization": {"file": "/run/secret"}}"#,
            body: #"{"a": {"aud": "{{audience}}"}}"#)
        let configuration = try BrokerConfiguration(json: Array(provider(allTemplateKeys, source: source).utf8))
        guard case .http(let settings) = configuration.providers[0].source else {
            Issue.record("not an http source")
            return
        }
        #expect(settings.url == "https://issuer.example/t/{{resource}}?aud={{audience}}#{{scope}}")
    }

    @Test(arguments: [
        ("url", "https://issuer.example/?a={{foo}}", "providers[0].source.url: unknown placeholder {{foo}}"),
        ("url", "https://issuer.example/?a={{Audience}}", "providers[0].source.url: unknown placeholder {{Audience}}"),
        ("body", "a={{ audience }}", "providers[0].source.body: unknown placeholder {{ audience }}"),
        (
            "url", "https://issuer.example/?a={{audience",
            "providers[0].source.url: \"{{\" opens a placeholder that is never closed"
        ),
        (
            "body", "{\"a\": \"{{audience}\"}",
            "providers[0].source.body: \"{{\" opens a placeholder that is never closed"
        ),
        ("body", "{{{audience}}", "providers[0].source.body: unknown placeholder {{{audience}}"),
        ("header", "Bearer {{}}", "providers[0].source.headers.X-Aud: unknown placeholder {{}}"),
    ])
    func anUnknownOrMalformedPlaceholderIsRefusedNamingTheKey(_ place: String, _ text: String, _ expected: String) {
        let source =
            switch place {
            case "url": http(url: text)
            case "body": http(body: text)
            default: http(headers: #"{"X-Aud": \#(JSONText.quoted(text))}"#)
            }
        let message = configurationProblem(provider(allTemplateKeys, source: source))
        #expect(message?.hasPrefix(expected) == true, "\(message ?? "accepted")")
        #expect(message?.contains("allowed: {{audience}}, {{scope}}, {{resource}}") == true)
    }

    @Test func aPlaceholderForAParameterNotPerRequestIsRefusedNamingTheKey() {
        #expect(
            configurationProblem(provider(audienceAndScope, source: http(body: "res={{resource}}")))
                == "providers[0].source.body: {{resource}} needs \"resource\" in the provider's perRequest")
        #expect(
            configurationProblem(
                provider(audienceAndScope, source: http(headers: #"{"X-R": "{{resource}}", "X-A": "{{audience}}"}"#)))
                == "providers[0].source.headers.X-R: {{resource}} needs \"resource\" in the provider's perRequest")
        #expect(
            configurationProblem(provider("", source: http(url: "https://issuer.example/?aud={{audience}}")))
                == "providers[0].source.url: {{audience}} needs \"audience\" in the provider's perRequest"
                + " (a provider without perRequest takes no placeholder)")
    }

    @Test(arguments: [
        "https://{{audience}}/token", "https://issuer.example:{{audience}}/token", "https://issuer.{{audience}}/x",
        "https://user:{{audience}}@issuer.example/", "https://{{audience}}",
    ])
    func aPlaceholderInTheSchemeOrHostIsRefused(_ url: String) {
        let message = configurationProblem(provider(allTemplateKeys, source: http(url: url)))
        if url.contains("@") {
            // User information is refused before placeholders are looked for, with or without them.
            #expect(message?.hasPrefix("providers[0].source.url: has user information") == true, "\(url)")
            return
        }
        #expect(
            message
                == "providers[0].source.url: a placeholder may stand in the path, query or fragment,"
                + " not in the scheme or host", "\(url)")
    }

    @Test(arguments: [
        "https://issuer.example/{{audience}}", "https://issuer.example?a={{audience}}",
        "https://issuer.example#{{audience}}",
    ])
    func aPlaceholderJustAfterTheHostIsFine(_ url: String) {
        #expect(configurationProblem(provider(allTemplateKeys, source: http(url: url))) == nil, "\(url)")
    }

    @Test func theContentTypeCannotHoldAPlaceholderAndHeaderNamesTakeNone() {
        #expect(
            configurationProblem(provider(allTemplateKeys, source: http(headers: #"{"content-type": "{{scope}}"}"#)))
                == "providers[0].source.headers.content-type: Content-Type decides how placeholders in the body"
                + " are encoded: it cannot hold one")
        #expect(
            configurationProblem(provider(allTemplateKeys, source: http(headers: #"{"X-{{scope}}": "v"}"#)))
                == "providers[0].source.headers.X-{{scope}}: placeholders are replaced in header values, not in names")
    }

    /// A header name is an RFC 9110 token, and none that frames the request: libcurl sets those
    /// for what it sends, and a configured one would contradict it.
    @Test func aHeaderNameIsATokenAndNotOneThatFramesTheRequest() {
        for name in ["X(Y)", "X/Y", "X;Y", "X@Y", "X\\\"Y", "X=Y", "[X]"] {
            let message = configurationProblem(
                provider("", source: http(headers: #"{\#(JSONText.quoted(name)): "v"}"#)))
            #expect(
                message?.hasSuffix(
                    "is not a header name; allowed: letters, digits and !#$%&'*+-.^_`|~ (an RFC 9110 token)") == true,
                "\(name): \(message ?? "accepted")")
        }
        for name in ["Content-Length", "transfer-encoding", "Connection", "Expect", "TE", "Upgrade"] {
            #expect(
                configurationProblem(provider("", source: http(headers: #"{\#(JSONText.quoted(name)): "v"}"#)))
                    == "providers[0].source.headers.\(name): frames the request, which the client library sets for"
                    + " what it sends; it cannot be configured", "\(name)")
        }
        for name in ["Host", "X-Api-Key", "x!#$%&'*+-.^_`|~1"] {
            #expect(
                configurationProblem(provider("", source: http(headers: #"{\#(JSONText.quoted(name)): "v"}"#))) == nil,
                "\(name)")
        }
    }

    @Test func bodyPlaceholdersNeedAnInlineContentType() {
        let fromFile = http(headers: #"{"Content-Type": {"file": "/run/type"}}"#, body: "a={{audience}}")
        #expect(
            configurationProblem(provider(allTemplateKeys, source: fromFile))
                == "providers[0].source.body: placeholders in the body need Content-Type given inline,"
                + " which decides how they are encoded")
        let noPlaceholder = http(headers: #"{"Content-Type": {"file": "/run/type"}}"#, body: "a=b")
        #expect(configurationProblem(provider(allTemplateKeys, source: noPlaceholder)) == nil)
    }

    @Test(arguments: [
        #"{"n": {{audience}}}"#, #"{"n": [{{audience}}]}"#, #"{"a": "x"{{audience}}}"#, #"{"a": "x"} {{scope}}"#,
        #"{"k\\": {{audience}}}"#, #"{"a": "\{{audience}}"}"#, #"{"a": "{{audience}}", "b": {{scope}}}"#,
    ])
    func aJSONBodysPlaceholderOutsideAStringLiteralIsRefused(_ body: String) {
        let source = http(headers: #"{"Content-Type": "application/json"}"#, body: body)
        #expect(
            configurationProblem(provider(allTemplateKeys, source: source))
                == "providers[0].source.body: with a JSON Content-Type, a placeholder must stand inside a JSON string"
                + #" ("aud": "{{audience}}"), where its value is escaped"#, "\(body)")
    }

    @Test(arguments: [
        #"{"a": "{{audience}}"}"#, #"{"{{audience}}": 1}"#, #"{"a": "\"{{audience}}\"", "b": "x {{scope}} y"}"#,
        #"{"k\\": "{{audience}}", "n": 1}"#, #"{"a": "\\{{audience}}"}"#, #"{"a": "}}{{scope}}"}"#,
    ])
    func aJSONBodysPlaceholderInsideAStringLiteralIsAccepted(_ body: String) {
        let source = http(headers: #"{"Content-Type": "application/problem+json"}"#, body: body)
        #expect(configurationProblem(provider(allTemplateKeys, source: source)) == nil, "\(body)")
    }

    @Test func outsideAJSONBodyAPlaceholderMayStandAnywhere() {
        for contentType in ["application/x-www-form-urlencoded", "text/plain"] {
            let source = http(headers: #"{"Content-Type": "\#(contentType)"}"#, body: "n={{audience}}&{{scope}}")
            #expect(configurationProblem(provider(allTemplateKeys, source: source)) == nil, "\(contentType)")
        }
        #expect(configurationProblem(provider(allTemplateKeys, source: http(body: "n: {{audience}}"))) == nil)
    }

    @Test func aHeaderReadFromAFileIsNeverCheckedForPlaceholders() {
        let source = http(headers: #"{"Authorization": {"file": "/run/{{odd"}}"#)
        #expect(configurationProblem(provider("", source: source)) == nil)
    }

    @Test func textWithoutPlaceholdersIsUnchangedAndAcceptedWithoutPerRequest() {
        #expect(configurationProblem(provider("", source: http(body: #"{"a":{"b":"}}"}}"#))) == nil)
    }

    /// The example in `HTTPSourceConfiguration`'s documentation, as the README shows it.
    @Test func theDocumentedExampleIsAccepted() throws {
        let json = #"""
            {"providers": [
            {"name": "waf", "perRequest": ["audience", "scope"],
             "allowedAudiences": ["https://*"], "allowedScopes": ["read", "write"],
             "source": {"type": "http", "url": "https://tokens.example/issue?aud={{audience}}",
                        "headers": {"Content-Type": "application/json", "X-Scope": "{{scope}}"},
                        "body": "{\"audience\": \"{{audience}}\", \"scope\": \"{{scope}}\"}"}}
            ]}
            """#
        let configuration = try BrokerConfiguration(json: Array(json.utf8))
        guard case .http(let settings) = configuration.providers[0].source else {
            Issue.record("not an http source")
            return
        }
        #expect(settings.bodyEncoding == .json)
    }

    // MARK: - the parsed text and the body's encoding

    @Test func aTextIsCutAtItsPlaceholdersAndALoneClosingPairIsText() throws {
        let text = try PlaceholderText(parsing: #"{"a":{"b":"{{audience}}"}}{{scope}}}{{resource}}"#)
        #expect(
            text.parts == [
                .text(#"{"a":{"b":""#), .placeholder(.audience), .text(#""}}"#), .placeholder(.scope), .text("}"),
                .placeholder(.resource),
            ])
        #expect(text.parameters == [.audience, .scope, .resource])
        #expect(text.filled { "<\($0.rawValue)>" } == #"{"a":{"b":"<audience>"}}<scope>}<resource>"#)
        #expect(try PlaceholderText(parsing: "").parts.isEmpty)
        #expect(try PlaceholderText(parsing: "caf\u{E9} {} }} {").parts == [.text("caf\u{E9} {} }} {")])
    }

    @Test(arguments: [
        (nil, HTTPSourceConfiguration.BodyEncoding.form),
        ("application/x-www-form-urlencoded", .form),
        ("Application/X-WWW-Form-Urlencoded; charset=utf-8", .form),
        ("application/json", .json), (" application/json ; charset=utf-8", .json),
        ("application/jwt-bearer+json", .json), ("text/plain", .asIs), ("application/xml", .asIs),
        ("application/jsonx", .asIs),
    ])
    func theBodysEncodingFollowsTheConfiguredContentType(
        _ contentType: String?, _ expected: HTTPSourceConfiguration.BodyEncoding
    ) {
        var settings = HTTPSourceConfiguration(url: "https://issuer.example/")
        if let contentType { settings.headers["content-TYPE"] = .value(contentType) }
        #expect(settings.bodyEncoding == expected, "\(contentType ?? "none")")
    }
}
