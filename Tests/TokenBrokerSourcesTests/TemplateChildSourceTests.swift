import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSources
import TokenBrokerTestSupport
import TokenBrokerUpstream

/// A template's children fetch with their values put in: the `oauth2` token request's form, the
/// local signer's claims (checked by the `openssl` command line), and the `http` source's URL,
/// headers and body, each encoded for its place and seen by a loopback server.
@Suite struct TemplateChildSourceTests {
    /// Values with the characters that could leave their place in a URL, a form or a JSON string.
    /// Audience and resource may be any visible ASCII; scope tokens exclude `"` and `\`.
    private let hostile = TokenRequestValues(
        audience: ##"https://a.example/p?x=1&y="2"\#\%41+z"##, scopes: ["w&x=1", "r+%2", "q#"],
        resource: ##"urn:r\"e&s=o#u+r%ce"##)

    /// `application/x-www-form-urlencoded` read back by Foundation, independently of the code under test.
    private func formPairs(_ body: String) -> [(String, String)] {
        body.split(separator: "&", omittingEmptySubsequences: false).map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "<undecodable>"
            }
            return (parts[0], parts.count > 1 ? parts[1] : "<no value>")
        }
    }

    // MARK: - oauth2

    private func oauth2(_ url: String) -> OAuth2SourceConfiguration {
        var settings = OAuth2SourceConfiguration(tokenURL: url, clientID: "client")
        settings.clientSecret = "secret"
        settings.scope = "default-scope"
        settings.audience = "https://default.example"
        settings.resources = ["https://r1.example", "https://r2.example"]
        settings.extraParams = [("tenant", "t1")]
        return settings
    }

    @Test func anOAuth2ChildSendsItsValuesInPlaceOfTheDefaults() async throws {
        let server = try RecordingServer()
        let template = try OAuth2TokenSource(configuration: oauth2(server.url("/token")))
        let token = try await template.child(for: hostile).fetch()
        #expect(token.accessToken == "recorded-token")
        let request = try #require(await server.request())
        #expect(request.requestLine == "POST /token HTTP/1.1")
        #expect(request.header("Content-Type") == "application/x-www-form-urlencoded")
        #expect(request.header("Authorization") == "Basic " + Data("client:secret".utf8).base64EncodedString())
        // The scope set is sorted, space-joined, and the space is a `+`; everything else is escaped.
        #expect(
            request.bodyText
                == "grant_type=client_credentials&scope=q%23+r%2B%252+w%26x%3D1"
                + "&audience=https%3A%2F%2Fa.example%2Fp%3Fx%3D1%26y%3D%222%22%5C%23%5C%2541%2Bz"
                + "&resource=urn%3Ar%5C%22e%26s%3Do%23u%2Br%25ce&tenant=t1")
        let pairs = formPairs(request.bodyText)
        #expect(pairs.map(\.0) == ["grant_type", "scope", "audience", "resource", "tenant"], "one resource, replaced")
        #expect(pairs[1].1 == "q# r+%2 w&x=1")
        #expect(pairs[2].1 == hostile.audience)
        #expect(pairs[3].1 == hostile.resource)
    }

    @Test func anOAuth2ChildKeepsTheDefaultsOfWhatItDoesNotName() throws {
        let template = try OAuth2TokenSource(configuration: oauth2("https://issuer.example/token"))
        let child = template.child(for: TokenRequestValues(audience: "https://orders.example"))
        let pairs = formPairs(String(decoding: try child.request(now: WallTime()).body, as: UTF8.self))
        #expect(pairs.filter { $0.0 == "scope" }.map(\.1) == ["default-scope"])
        #expect(pairs.filter { $0.0 == "audience" }.map(\.1) == ["https://orders.example"])
        #expect(pairs.filter { $0.0 == "resource" }.map(\.1) == ["https://r1.example", "https://r2.example"])
        let scoped = template.child(for: TokenRequestValues(scopes: ["write", "read", "write"]))
        let scopedBody = String(decoding: try scoped.request(now: WallTime()).body, as: UTF8.self)
        #expect(scopedBody.contains("&scope=read+write&"), "a set: sorted, without repeats")
        #expect(formPairs(scopedBody).filter { $0.0 == "audience" }.map(\.1) == ["https://default.example"])
    }

    @Test func anOAuth2ChildWithNoValuesSendsExactlyWhatTheTemplateSends() throws {
        let template = try OAuth2TokenSource(configuration: oauth2("https://issuer.example/token"))
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        let parent = try template.request(now: now)
        let child = try template.child(for: .none).request(now: now)
        #expect(child.method == parent.method && child.url == parent.url && child.body == parent.body)
        #expect(child.headers.map(\.0) == parent.headers.map(\.0) && child.headers.map(\.1) == parent.headers.map(\.1))
        #expect(template.child(for: .none).values == .none && template.values == .none)
    }

    /// The client-assertion key is loaded once, by the template: its children sign with it even
    /// once the file is gone, and their assertions verify with its public key.
    @Test func anOAuth2ChildSignsItsAssertionWithTheTemplatesKey() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("client.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyPath])
        try OpenSSL.run(["pkey", "-in", keyPath, "-pubout", "-out", directory.path("public.pem")])
        var settings = OAuth2SourceConfiguration(tokenURL: "https://issuer.example/token", clientID: "client")
        settings.clientAuth = .privateKeyJWT
        settings.privateKeyFile = keyPath
        let template = try OAuth2TokenSource(configuration: settings)
        try FileManager.default.removeItem(atPath: keyPath)

        let child = template.child(for: TokenRequestValues(audience: "https://orders.example"))
        let pairs = formPairs(String(decoding: try child.request(now: WallTime()).body, as: UTF8.self))
        let assertion = try #require(pairs.first { $0.0 == "client_assertion" }?.1)
        #expect(try verifies(assertion, publicKey: directory.path("public.pem"), in: directory))
        #expect(pairs.first { $0.0 == "audience" }?.1 == "https://orders.example")
    }

    // MARK: - the local signer

    /// Whether `openssl` verifies the ES256 JWT `token` with the PEM public key at `publicKey`.
    private func verifies(_ token: String, publicKey: String, in directory: TemporaryDirectory) throws -> Bool {
        let parts = token.split(separator: ".").map(String.init)
        guard parts.count == 3, let raw = Base64URL.decode(parts[2]), raw.count == 64 else { return false }
        try Data((parts[0] + "." + parts[1]).utf8).write(to: URL(fileURLWithPath: directory.path("input")))
        try Data(DER.ecdsaSignature(raw: raw)).write(to: URL(fileURLWithPath: directory.path("signature")))
        let verdict = try OpenSSL.run([
            "dgst", "-sha256", "-verify", publicKey, "-signature", directory.path("signature"), directory.path("input"),
        ])
        return verdict.contains("Verified OK")
    }

    private func claims(_ token: String) throws -> [String: Any] {
        let payload = try #require(Base64URL.decode(String(token.split(separator: ".")[1])))
        let claims = try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any]
        return try #require(claims)
    }

    private func signer(in directory: TemporaryDirectory) throws -> JWTSigner {
        let keyPath = directory.path("key.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyPath])
        try OpenSSL.run(["pkey", "-in", keyPath, "-pubout", "-out", directory.path("public.pem")])
        return try JWTSigner(
            configuration: JWTSourceConfiguration(
                keyFile: keyPath, issuer: "broker", audience: "configured-audience", subject: "svc"))
    }

    @Test func aSignersChildCarriesItsAudienceAndScopeAndVerifiesWithTheTemplatesKey() throws {
        let directory = try TemporaryDirectory()
        let template = try signer(in: directory)
        let child = template.child(
            for: TokenRequestValues(audience: #"https://orders.example/"quoted"\path"#, scopes: ["write", "read"]))
        let token = try child.mint(now: WallTime(timeIntervalSince1970: 1_800_000_000))
        #expect(try verifies(token.accessToken, publicKey: directory.path("public.pem"), in: directory))
        let claims = try claims(token.accessToken)
        #expect(claims["aud"] as? String == #"https://orders.example/"quoted"\path"#)
        #expect(claims["scope"] as? String == "read write")
        #expect(claims["iss"] as? String == "broker" && claims["sub"] as? String == "svc")
        #expect(claims["exp"] as? Int == 1_800_000_900)
        let headerPart = try #require(Base64URL.decode(String(token.accessToken.split(separator: ".")[0])))
        let header = try JSONSerialization.jsonObject(with: Data(headerPart)) as? [String: Any]
        #expect(header?["kid"] as? String == template.keyID, "the one published key verifies every child")
        #expect(JWTSigner.jwks([template]) == JWTSigner.jwks([child]))
    }

    @Test func aSignersChildWithoutAScopeHasNoScopeClaimAndKeepsTheDefaultAudience() throws {
        let directory = try TemporaryDirectory()
        let template = try signer(in: directory)
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        let scoped = try claims(template.child(for: TokenRequestValues(scopes: ["read"])).mint(now: now).accessToken)
        #expect(scoped["aud"] as? String == "configured-audience" && scoped["scope"] as? String == "read")
        let audienceOnly = try claims(
            template.child(for: TokenRequestValues(audience: "https://a.example")).mint(now: now).accessToken)
        #expect(audienceOnly["aud"] as? String == "https://a.example")
        #expect(audienceOnly["scope"] == nil)

        var fromTemplate = try claims(template.mint(now: now).accessToken)
        var fromChild = try claims(template.child(for: .none).mint(now: now).accessToken)
        #expect(fromTemplate.removeValue(forKey: "jti") != nil && fromChild.removeValue(forKey: "jti") != nil)
        #expect(NSDictionary(dictionary: fromTemplate) == NSDictionary(dictionary: fromChild))
        #expect(fromChild.keys.sorted() == ["aud", "exp", "iat", "iss", "nbf", "sub"])
    }

    // MARK: - http

    private func http(
        _ server: RecordingServer, path: String, headers: [String: HTTPSourceConfiguration.HeaderValue] = [:],
        body: String? = nil
    ) -> HTTPTokenSource {
        var settings = HTTPSourceConfiguration(url: server.url(path))
        settings.headers = headers
        settings.body = body
        return HTTPTokenSource(configuration: settings)
    }

    @Test func inTheURLEachValueIsPercentEncodedAndStaysOneQueryValue() async throws {
        let server = try RecordingServer()
        let source = http(server, path: "/t/{{resource}}?aud={{audience}}&scope={{scope}}&k=v")
        let token = try await source.child(for: hostile).fetch()
        #expect(token.accessToken == "recorded-token")
        let request = try #require(await server.request())
        let audience = "https%3A%2F%2Fa.example%2Fp%3Fx%3D1%26y%3D%222%22%5C%23%5C%2541%2Bz"
        let resource = "urn%3Ar%5C%22e%26s%3Do%23u%2Br%25ce"
        #expect(
            request.requestLine
                == "POST /t/\(resource)?aud=\(audience)&scope=q%23%20r%2B%252%20w%26x%3D1&k=v HTTP/1.1")
        let target = String(request.requestLine.dropFirst("POST ".count).dropLast(" HTTP/1.1".count))
        let components = try #require(URLComponents(string: "http://h" + target))
        #expect(components.queryItems?.map(\.name) == ["aud", "scope", "k"])
        #expect(components.queryItems?.map(\.value) == [hostile.audience, "q# r+%2 w&x=1", "v"])
        #expect(components.path == "/t/" + (hostile.resource ?? ""))
    }

    @Test func inAFormBodyEachValueIsFormEncoded() async throws {
        let server = try RecordingServer()
        let source = http(
            server, path: "/token",
            headers: ["Content-Type": .value("application/x-www-form-urlencoded; charset=utf-8")],
            body: "aud={{audience}}&scope={{scope}}&resource={{resource}}&k=v")
        _ = try await source.child(for: hostile).fetch()
        let request = try #require(await server.request())
        let pairs = formPairs(request.bodyText)
        #expect(pairs.map(\.0) == ["aud", "scope", "resource", "k"])
        #expect(pairs.map(\.1) == [hostile.audience, "q# r+%2 w&x=1", hostile.resource, "v"])
        #expect(request.bodyText.contains("&scope=q%23+r%2B%252+w%26x%3D1&"), "a space is +")
    }

    /// With no `Content-Type` configured, the form type is what goes out with a body, so values
    /// are form-encoded: as is, `&` and `=` would add parameters.
    @Test func withoutAContentTypeTheBodyIsSentAsAFormAndFormEncoded() async throws {
        let server = try RecordingServer()
        _ = try await http(server, path: "/token", body: "aud={{audience}}&k=v").child(for: hostile).fetch()
        let request = try #require(await server.request())
        #expect(request.header("Content-Type") == "application/x-www-form-urlencoded")
        let pairs = formPairs(request.bodyText)
        #expect(pairs.map(\.0) == ["aud", "k"])
        #expect(pairs[0].1 == hostile.audience)
    }

    @Test(arguments: ["application/json", "application/vnd.issuer+json; charset=utf-8"])
    func inAJSONBodyEachValueIsEscapedInsideItsString(_ contentType: String) async throws {
        let server = try RecordingServer()
        let source = http(
            server, path: "/token", headers: ["Content-Type": .value(contentType)],
            body: #"{"aud": "{{audience}}", "scope": "{{scope}}", "nested": {"res": "{{resource}}"}}"#)
        _ = try await source.child(for: hostile).fetch()
        let request = try #require(await server.request())
        let parsed = try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any]
        let document = try #require(parsed)
        #expect(document.keys.sorted() == ["aud", "nested", "scope"])
        #expect(document["aud"] as? String == hostile.audience)
        #expect(document["scope"] as? String == "q# r+%2 w&x=1")
        #expect((document["nested"] as? [String: Any])?["res"] as? String == hostile.resource)
        #expect(request.bodyText.contains(##"y=\"2\"\\#\\%41+z""##), "quotes and backslashes escaped, nothing else")
    }

    @Test func inOtherBodiesAndInHeaderValuesEachValueIsAsIs() async throws {
        let directory = try TemporaryDirectory()
        try Data("Bearer {{audience}}\n".utf8).write(to: URL(fileURLWithPath: directory.path("auth")))
        let server = try RecordingServer()
        let source = http(
            server, path: "/token",
            headers: [
                "Content-Type": .value("text/plain"), "X-Audience": .value("aud={{audience}};"),
                "X-Scope": .value("{{scope}}"), "Authorization": .file(directory.path("auth")),
            ],
            body: "audience {{audience}} scope {{scope}}")
        _ = try await source.child(for: hostile).fetch()
        let request = try #require(await server.request())
        #expect(request.bodyText == "audience \(hostile.audience ?? "") scope q# r+%2 w&x=1")
        #expect(request.header("X-Audience") == "aud=\(hostile.audience ?? "");")
        #expect(request.header("X-Scope") == "q# r+%2 w&x=1")
        #expect(request.header("Authorization") == "Bearer {{audience}}", "a header read from a file is not filled")
    }

    /// A header configured with an empty value is not sent, and keeps libcurl from sending one
    /// of its own under that name; the proxy alone sends empty values (as its clients sent them).
    @Test func aHeaderConfiguredEmptyIsWithheldNotSentEmpty() throws {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.headers = [
            "Accept": .value(""), "X-Empty": .value(""), "X-Blank": .value(" \t "), "X-Kept": .value(" v\t"),
        ]
        let request = try HTTPTokenSource(configuration: settings).request()
        #expect(!request.headers.contains { $0.1.isEmpty })
        // Blanks around a value are no part of it.
        #expect(request.headers.contains { $0.0 == "X-Kept" && $0.1 == Array("v".utf8) })
        #expect(request.withheld.sorted() == ["Accept", "X-Blank", "X-Empty"])
    }

    /// A placeholder has no default: the routes and sinks refuse a request that leaves one of
    /// its values out, and the source, made with such values all the same, refuses to fetch
    /// rather than send the value empty (which no allow-list allowed).
    @Test func aValueNotNamedIsRefusedNeverSentEmpty() throws {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t?aud={{audience}}&scope={{scope}}")
        settings.headers = ["Content-Type": .value("application/json"), "X-Resource": .value("[{{resource}}]")]
        settings.body = #"{"aud":"{{audience}}"}"#
        let template = HTTPTokenSource(configuration: settings)
        for values in [
            TokenRequestValues.none, TokenRequestValues(audience: "a"),
            TokenRequestValues(audience: "a", scopes: ["r"]),
            TokenRequestValues(scopes: ["r"], resource: "urn:x"),
        ] {
            do {
                _ = try template.child(for: values).request()
                Issue.record("\(values) leaves a placeholder's value out")
            } catch {
                #expect(error.description == "configuration")
                #expect(error.detail.hasSuffix("is not named, and the source's placeholders have no default"))
            }
        }
        #expect(throws: TokenFetchError.self) { try template.request() }
        let named = try template.child(for: TokenRequestValues(audience: "a", scopes: ["r"], resource: "urn:x"))
            .request()
        #expect(named.url == "http://127.0.0.1:1/t?aud=a&scope=r")
        #expect(String(decoding: named.body, as: UTF8.self) == #"{"aud":"a"}"#)
        #expect(named.headers.first { $0.0 == "X-Resource" }?.1 == Array("[urn:x]".utf8))
        // Without placeholders, no value is needed: the template's request is the child's.
        let plain = HTTPTokenSource(configuration: HTTPSourceConfiguration(url: "http://127.0.0.1:1/t"))
        #expect(try plain.child(for: .none).request().url == plain.request().url)
    }

    /// Values reach a source already checked; a value with a line break (which no check lets
    /// through) is still refused for a header instead of being sent.
    @Test func aValueWithAControlCharacterNeverGoesInAHeader() {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.headers = ["X-Audience": .value("{{audience}}")]
        let child = HTTPTokenSource(configuration: settings).child(
            for: TokenRequestValues(audience: "a\r\nX-Injected: 1"))
        #expect(throws: TokenFetchError.self) { try child.request() }
        #expect(
            (try? HTTPTokenSource(configuration: settings).child(for: TokenRequestValues(audience: "a")).request())
                != nil)
    }

    /// The client leaves out a header holding NUL: a header file with a control character is a
    /// `configuration` error at the fetch, never a header silently not sent.
    @Test func aHeaderFileWithAControlCharacterIsAnErrorNotAHeaderLeftOut() throws {
        let directory = try TemporaryDirectory()
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.headers = ["X-Api-Key": .file(directory.path("key"))]
        for (content, refused) in [("k\u{0}ey\n", true), ("k\u{7F}ey", true), ("k\u{1B}ey", true), ("k\tey\n", false)] {
            try Data(content.utf8).write(to: URL(fileURLWithPath: directory.path("key")))
            do {
                let request = try HTTPTokenSource(configuration: settings).request()
                #expect(!refused, "\(content.debugDescription) was sent")
                #expect(request.headers.first { $0.0 == "X-Api-Key" }?.1 == Array("k\tey".utf8))
            } catch {
                #expect(refused, "\(content.debugDescription): \(error.detail)")
                #expect(
                    error.description == "configuration"
                        && error.detail.hasSuffix("holds a control character; it cannot go in X-Api-Key"))
            }
        }
    }

    @Test func aSourceMadeInCodeWithABadPlaceholderFailsAsMisconfigured() async {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.body = "a={{audiance}}"
        do {
            _ = try await HTTPTokenSource(configuration: settings).fetch()
            Issue.record("a bad placeholder must not fetch")
        } catch {
            #expect(error.description == "configuration")
            #expect(error.detail.hasPrefix("body: unknown placeholder {{audiance}}"))
        }
    }
}
