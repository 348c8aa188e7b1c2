import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerUpstream

/// How issuers' answers become tokens or classified errors (RFC 6749 §5.1 and §5.2).
@Suite struct UpstreamAnswerTests {
    private func answer(_ status: Int, _ body: String, headers: [String: String] = [:]) -> UpstreamResponse {
        UpstreamResponse(status: status, headers: headers, body: Array(body.utf8))
    }

    private func classification(_ response: UpstreamResponse) -> String? {
        do {
            _ = try OAuth2TokenSource.token(from: response, defaultLifetime: 3600)
            return nil
        } catch {
            return error.description
        }
    }

    @Test func aGoodAnswerGivesTheTokenWithItsLifetimeAndNormalisedType() throws {
        let token = try OAuth2TokenSource.token(
            from: answer(200, #"{"access_token":"abc","token_type":"bearer","expires_in":120,"scope":"read"}"#),
            defaultLifetime: 3600)
        #expect(
            token
                == FetchedToken(
                    accessToken: "abc", tokenType: "Bearer", lifetime: .seconds(120), scope: "read", upstreamStatus: 200
                ))
        let noExpiry = try OAuth2TokenSource.token(
            from: answer(200, #"{"access_token":"abc","token_type":"Bearer"}"#), defaultLifetime: 77)
        #expect(noExpiry.lifetime == .seconds(77))
        let stringExpiry = try OAuth2TokenSource.token(
            from: answer(200, #"{"access_token":"abc","expires_in":"60"}"#), defaultLifetime: 77)
        #expect(stringExpiry.lifetime == .seconds(60))
    }

    @Test(arguments: [
        (200, "<html>portal</html>", "bad_response"), (200, #"{"token_type":"Bearer"}"#, "bad_response"),
        (200, #"{"access_token":"a","expires_in":-1}"#, "bad_response"),
        (200, #"{"access_token":"a","expires_in":0}"#, "bad_response"),
        (200, #"{"access_token":"a","expires_in":1e12}"#, "bad_response"),
        (200, #"{"access_token":"has space"}"#, "bad_response"),
        (200, #"{"access_token":""}"#, "bad_response"), (302, "", "bad_response"),
        (400, #"{"error":"invalid_client"}"#, "credentials_rejected"),
        (400, #"{"error":"invalid_scope"}"#, "bad_response"),
        (401, #"{"error":"invalid_client"}"#, "credentials_rejected"), (403, "", "credentials_rejected"),
        (429, #"{"error":"slow_down"}"#, "rate_limited"), (503, "", "server_error"), (500, "oops", "server_error"),
    ])
    func badAnswersAreClassified(_ status: Int, _ body: String, _ expected: String) {
        #expect(classification(answer(status, body)) == expected)
    }

    @Test func retryAfterIsReadInSecondsOrAsAnHTTPDate() {
        let now = WallTime(timeIntervalSince1970: 784_111_717)  // Sun, 06 Nov 1994 08:48:37 GMT
        func retryAfter(_ value: String) -> Duration? {
            UpstreamResponse(status: 503, headers: ["retry-after": value], body: []).retryAfter(now: now)
        }
        #expect(retryAfter("120") == .seconds(120))
        #expect(retryAfter(" 0 ") == .seconds(0))
        #expect(retryAfter("999999") == .seconds(3600), "capped at an hour")
        #expect(retryAfter("Sun, 06 Nov 1994 08:49:37 GMT") == .seconds(60))
        #expect(retryAfter("Sun, 06 Nov 1994 08:00:00 GMT") == .seconds(0), "a date in the past means now")
        // The obsolete forms a recipient must read too (RFC 9110 §5.6.7).
        #expect(retryAfter("Sunday, 06-Nov-94 08:49:37 GMT") == .seconds(60))
        #expect(retryAfter("Sun Nov  6 08:49:37 1994") == .seconds(60))
        #expect(retryAfter("-5") == nil && retryAfter("soon") == nil)
    }

    @Test func errorsKeepTheIssuersCodeAndRetryAfter() {
        do {
            _ = try OAuth2TokenSource.token(
                from: answer(
                    429, #"{"error":"slow_down","error_description":"too many"}"#, headers: ["retry-after": "7"]),
                defaultLifetime: 1)
            Issue.record("a 429 must not give a token")
        } catch {
            #expect(error.retryAfter == .seconds(7))
            #expect(error.httpStatus == 429)
            #expect(error.detail == "HTTP 429 slow_down: too many")
        }
    }

    @Test func theGenericSourceFollowsItsPointers() throws {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.tokenPointer = "/data/token"
        settings.expiresAtPointer = "/data/exp"
        let source = HTTPTokenSource(configuration: settings)
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        let token = try source.token(from: answer(200, #"{"data":{"token":"t-1","exp":1800000090}}"#), now: now)
        #expect(token.accessToken == "t-1" && token.lifetime == .seconds(90))
        #expect(throws: TokenFetchError.self) {
            try source.token(from: answer(200, #"{"data":{"exp":1800000090}}"#), now: now)
        }
        #expect(throws: TokenFetchError.self) {
            try source.token(from: answer(200, #"{"data":{"token":"t","exp":1700000000}}"#), now: now)
        }
    }

    @Test func aJWTWithoutTheConfiguredLifetimeMemberExpiresAtItsExpWithEitherPointer() throws {
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        let claims = Data(#"{"sub":"s","exp":1800000120}"#.utf8).base64EncodedString()
            .replacingOccurrences(of: "=", with: "").replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
        let jwt = "eyJhbGciOiJub25lIn0." + claims + ".c2ln"
        for pointer in [\HTTPSourceConfiguration.expiresInPointer, \.expiresAtPointer] {
            var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
            settings[keyPath: pointer] = "/ttl"
            let source = HTTPTokenSource(configuration: settings)
            for body in [#"{"access_token":"\#(jwt)"}"#, #"{"access_token":"\#(jwt)","ttl":null}"#] {
                let token = try source.token(from: answer(200, body), now: now)
                #expect(token.lifetime == .seconds(120), "\(pointer) \(body)")
            }
        }
    }

    @Test func anIssuersContentTypeIsCutToPrintableASCII() {
        let html = answer(200, "<html>", headers: ["content-type": "text/html\u{1B}[2J\u{7F}\u{9B}31m\u{85}x"])
        do {
            _ = try OAuth2TokenSource.token(from: html, defaultLifetime: 60)
            Issue.record("an HTML answer is no token")
        } catch {
            #expect(
                error.detail
                    == "the answer is not JSON: unexpected character at byte 0 (Content-Type: text/html[2J31mx)")
        }
    }

    /// An answer that is JSON, but no object, says so; one that is not JSON says where it went
    /// wrong: a member given twice was "not a JSON object", which sent a reader looking elsewhere.
    @Test(arguments: [
        (
            #"{"access_token":"t","scope":"a","scope":"b"}"#,
            #"the answer is not JSON: the key "scope" appears twice at byte 43"#
        ),
        ("[1]", "the answer is not a JSON object"),
        (#"{"access_token":"t"} x"#, "the answer is not JSON: unexpected text after the value at byte 21"),
    ])
    func anAnswerThatIsNoJSONObjectSaysWhatItIs(_ body: String, _ expected: String) {
        do {
            _ = try OAuth2TokenSource.token(from: answer(200, body), defaultLifetime: 60)
            Issue.record("\(body) is no token")
        } catch {
            #expect(error.detail == expected)
        }
    }

    @Test func theSecretsGivenNeverComeBackInTheIssuersWords() {
        // An issuer that repeats the request it refuses, as some do: the secret as is, form-encoded,
        // and one secret that starts where a longer one does.
        let echo = answer(
            400,
            #"{"error":"invalid_client s3cr3t","error_description":"client c sent s3cr3t/x+y, body client_secret=s3cr3t%2Fx%2By, and key k3y-long"}"#
        )
        do {
            _ = try OAuth2TokenSource.token(
                from: echo, defaultLifetime: 60, hiding: ["s3cr3t/x+y", "s3cr3t%2Fx%2By", "k3y", "k3y-long", ""])
            Issue.record("a 400 is no token")
        } catch {
            #expect(
                error.detail
                    == "HTTP 400 invalid_client s3cr3t: client c sent [hidden], body client_secret=[hidden], and key [hidden]"
            )
        }
    }

    @Test func aSecretSplitByCharactersTheFilterDropsOrInAnotherCaseStaysHidden() {
        // The filter keeps printable ASCII: a zero-width space, a NUL, an escape or a combining
        // mark inside the secret would, dropped, bring it back whole if it were hidden first only.
        let secret = "TopSecretValue-42"
        for dressed in [
            "TopSecret\u{200B}Value-42", "Top\\u0000SecretValue-42", "TopSecretValue\\u001b-42",
            "T\u{301}opSecretValue-42", "TOPSECRETVALUE-42", "topsecret\u{2066}value-42",
        ] {
            let echo = answer(
                400, #"{"error":"invalid_client","error_description":"bad secret "# + dressed + #" here"}"#)
            do {
                _ = try OAuth2TokenSource.token(from: echo, defaultLifetime: 60, hiding: [secret])
                Issue.record("a 400 is no token")
            } catch {
                #expect(error.detail == "HTTP 400 invalid_client: bad secret [hidden] here", "\(dressed)")
            }
        }
        // A secret that holds non-ASCII is hidden before the filter would change it.
        let accented = answer(400, #"{"error":"invalid_client","error_description":"x p\#u{E4}ss\#u{200B}word y"}"#)
        do {
            _ = try OAuth2TokenSource.token(from: accented, defaultLifetime: 60, hiding: ["p\u{E4}ssword"])
            Issue.record("a 400 is no token")
        } catch {
            #expect(error.detail == "HTTP 400 invalid_client: x [hidden] y")
        }
    }

    /// An issuer may encode a secret before it echoes it, RFC 3986's way (`%20`, `/` as is or
    /// `%2F`) or a form's (`+`), hex in either case, every byte or some: `Sup3r%20Secret/Value%2B42`
    /// was shown whole, hidden only as given and form-encoded.
    @Test(arguments: [
        "Sup3r%20Secret/Value%2B42", "Sup3r%20Secret%2FValue%2B42", "sup3r%20secret%2fvalue%2b42",
        "Sup3r+Secret%2FValue%2B42", "%53%75%70%33%72%20%53%65%63%72%65%74%2F%56%61%6C%75%65%2B%34%32",
        "Sup3r Secret/Value+42", "Sup3r%2BSecret%252FValue%252B42",
    ])
    func aSecretEchoedPercentEncodedInAnyWayStaysHidden(_ dressed: String) {
        #expect(echoed(dressed, hiding: "Sup3r Secret/Value+42") == "HTTP 400 invalid_client: bad secret [hidden] here")
    }

    /// A secret holding `%`: its `%` is the text's `%` or opens an escape (`%25`), and the match
    /// must try both. It was shown whole when the issuer escaped it. The echoes are Python's
    /// (`quote`, `quote(safe="")`, and `quote(quote_plus)`: the request's form encoded again).
    @Test(arguments: [
        ("50%dis/count k3y", "50%25dis/count%20k3y"), ("50%dis/count k3y", "50%25dis%2Fcount%20k3y"),
        ("50%dis/count k3y", "50%2525dis%252Fcount%2Bk3y"), ("50%dis/count k3y", "50%dis/count k3y"),
        ("P%40ss/w0rd", "P%2540ss/w0rd"), ("P%40ss/w0rd", "P%252540ss%252Fw0rd"), ("P%40ss/w0rd", "P%40ss/w0rd"),
    ])
    func aSecretHoldingAPercentSignIsFoundEscapedOrNot(_ secret: String, _ dressed: String) {
        #expect(echoed(dressed, hiding: secret) == "HTTP 400 invalid_client: bad secret [hidden] here")
    }

    @Test func aSecretsUTF8IsFoundEscapedAndAnotherValueIsNotHidden() {
        #expect(
            echoed("p%C3%A4ss%c3%b6rd", hiding: "p\u{E4}ss\u{F6}rd")
                == "HTTP 400 invalid_client: bad secret [hidden] here")
        #expect(
            echoed("Sup3r%20Secret/Value%2B43", hiding: "Sup3r Secret/Value+42")
                == "HTTP 400 invalid_client: bad secret Sup3r%20Secret/Value%2B43 here")
        #expect(echoed("a%2", hiding: "a ") == "HTTP 400 invalid_client: bad secret a%2 here", "a cut escape")
        #expect(echoed("a%252", hiding: "a/") == "HTTP 400 invalid_client: bad secret a%252 here", "a cut escape")
        #expect(
            echoed("50%25dis/count%20k3z", hiding: "50%dis/count k3y")
                == "HTTP 400 invalid_client: bad secret 50%25dis/count%20k3z here")
    }

    /// The detail of a 400 whose `error_description` holds `dressed`, with `secret` hidden.
    private func echoed(_ dressed: String, hiding secret: String) -> String? {
        let echo = answer(400, #"{"error":"invalid_client","error_description":"bad secret "# + dressed + #" here"}"#)
        do {
            _ = try OAuth2TokenSource.token(from: echo, defaultLifetime: 60, hiding: [secret])
            return nil
        } catch {
            return error.detail
        }
    }

    @Test func clientSecretBasicFormEncodesThenBase64s() throws {
        var settings = OAuth2SourceConfiguration(tokenURL: "https://issuer.test/token", clientID: "my client")
        settings.clientSecret = "p@ss:word"
        settings.scope = "read write"
        settings.resources = ["https://a.test", "https://b.test"]
        let request = try OAuth2TokenSource(configuration: settings).request(now: WallTime())
        let authorization = request.headers.first { $0.0 == "Authorization" }.map {
            String(decoding: $0.1, as: UTF8.self)
        }
        // RFC 6749 §2.3.1: "my+client:p%40ss%3Aword", then Base64.
        #expect(authorization == "Basic " + Data("my+client:p%40ss%3Aword".utf8).base64EncodedString())
        #expect(
            String(decoding: request.body, as: UTF8.self)
                == "grant_type=client_credentials&scope=read+write&resource=https%3A%2F%2Fa.test&resource=https%3A%2F%2Fb.test"
        )
    }
}
