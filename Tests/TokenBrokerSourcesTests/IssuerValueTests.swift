import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerTestSupport
import TokenBrokerUpstream

/// What issuers and token files may say in numbers and names: checked, never trusted.
@Suite struct IssuerValueTests {
    private func answer(_ body: String) -> UpstreamResponse {
        UpstreamResponse(status: 200, headers: [:], body: Array(body.utf8))
    }

    private func classification(_ body: String) -> String? {
        do {
            _ = try OAuth2TokenSource.token(from: answer(body), defaultLifetime: 3600)
            return nil
        } catch {
            return error.description
        }
    }

    // MARK: - expires_in

    @Test(arguments: [(#""300""#, 300), ("300", 300), (#""0300""#, 300), ("31536000", 31_536_000), ("1", 1)])
    func expiresInIsDigitsOrAWholeNumber(_ value: String, _ seconds: Int) throws {
        let token = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"a","expires_in":"# + value + "}"), defaultLifetime: 3600)
        #expect(token.lifetime == .seconds(seconds))
    }

    @Test(arguments: [
        #""0x1p4""#, #""+300""#, #""3e2""#, #"" 300""#, #""300 ""#, #""300.0""#, #""-5""#, #""""#, #""٣٠٠""#,
        #""99999999999999999999""#, "300.5", "1e19", "-1e19", "1e300", "-1e300", "31536001", "0", "true", "[300]",
        // Whole values, but not written as 1*DIGIT.
        "300.0", "3e2", "3.0e2", "3E+2", "300e0", "30000e-2", "-0",
    ])
    func expiresInThatIsNotOneStarDigitIsABadResponse(_ value: String) {
        #expect(classification(#"{"access_token":"a","expires_in":"# + value + "}") == "bad_response", "\(value)")
    }

    // MARK: - scope

    @Test func theGrantedScopeIsServedAsGivenWhenItIsAnRFC6749Scope() throws {
        for scope in ["api", "read write", "urn:example:x https://api.example/"] {
            let token = try OAuth2TokenSource.token(
                from: answer(#"{"access_token":"a","scope":"\#(scope)"}"#), defaultLifetime: 60)
            #expect(token.scope == scope)
        }
        let none = try OAuth2TokenSource.token(from: answer(#"{"access_token":"a","scope":null}"#), defaultLifetime: 60)
        #expect(none.scope == nil)
    }

    /// The scope is copied into every answer for the token: a megabyte of it, or one with a
    /// bidirectional override and BEL, was served whole.
    @Test(arguments: [
        #""a\u202Eb""#, #""read\u0007""#, #""read\nwrite""#, #"" read""#, #""read  write""#, #""a\"b""#,
        #""caf\u00e9""#,
        "\"" + String(repeating: "read ", count: 200_000) + "x\"",
        "\"" + String(repeating: "a", count: 16 * 1024 + 1) + "\"",
        "7", "[\"read\"]", "true",
    ])
    func aScopeThatIsNoRFC6749ScopeIsABadResponse(_ value: String) {
        #expect(classification(#"{"access_token":"a","scope":"# + value + "}") == "bad_response", "\(value.prefix(40))")
    }

    // MARK: - token_type

    @Test func tokenTypeIsServedNormalised() throws {
        let token = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"a","token_type":"BEARER"}"#), defaultLifetime: 60)
        #expect(token.tokenType == "Bearer")
        let dpop = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"a","token_type":"dpop"}"#), defaultLifetime: 60)
        #expect(dpop.tokenType == "DPoP")
    }

    @Test(arguments: [
        #""Bearer\r\nX-Injected: 1""#, #""Bearer\u0000""#, "\"B" + String(repeating: "\u{301}", count: 2000) + "\"",
        #""""#, "7",
        #""urn:ietf:params:oauth:token-type:jwt""#, #""Bearer x""#,
    ])
    func tokenTypeThatIsNoTypeNameIsABadResponse(_ value: String) {
        #expect(classification(#"{"access_token":"a","token_type":"# + value + "}") == "bad_response", "\(value)")
    }

    // MARK: - the generic source's numbers

    @Test(arguments: ["1e300", "-1e300", "1e19", "-1e19", "1800000000.5e10"])
    func theGenericSourcesExpiryNumbersAreChecked(_ exp: String) {
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.tokenPointer = "/t"
        settings.expiresAtPointer = "/exp"
        let source = HTTPTokenSource(configuration: settings)
        #expect(throws: TokenFetchError.self) {
            try source.token(
                from: answer(#"{"t":"tok","exp":"# + exp + "}"), now: WallTime(timeIntervalSince1970: 1_800_000_000))
        }
    }

    // MARK: - the file source

    /// A JWT with the given payload, as text; the signature is not checked by the file source.
    private func jwt(payload: String) -> String {
        Self.base64URL(#"{"alg":"none"}"#) + "." + Self.base64URL(payload) + ".c2ln"
    }

    /// Base64url without padding, by Foundation.
    private static func base64URL(_ text: String) -> String {
        Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(
            of: "/", with: "_"
        )
        .replacingOccurrences(of: "=", with: "")
    }

    private func fetch(
        _ contents: String, lifetimeSec: Int? = nil, now: WallTime = WallTime(timeIntervalSince1970: 1_800_000_000)
    )
        throws(TokenFetchError) -> FetchedToken
    {
        let directory: TemporaryDirectory
        do {
            directory = try TemporaryDirectory()
            try Data(contents.utf8).write(to: URL(fileURLWithPath: directory.path("token")))
        } catch {
            throw .internalError("cannot write the test file")
        }
        defer { _ = directory }
        let file = FileTokenSource(
            configuration: FileSourceConfiguration(path: directory.path("token"), lifetimeSec: lifetimeSec))
        return try TokenRules().checked(try file.read(now: now))
    }

    private func fileFailure(_ contents: String, lifetimeSec: Int? = nil) -> TokenFetchError? {
        do {
            _ = try fetch(contents, lifetimeSec: lifetimeSec)
            return nil
        } catch {
            return error
        }
    }

    /// Payloads whose `exp` no 64-bit duration holds used to stop the broker (SIGILL) at refresh.
    @Test(arguments: [
        #"{"exp":1e16}"#, #"{"exp":-1e300}"#, #"{"exp":-1e19}"#, #"{"exp":1e300}"#, #"{"exp":1e19}"#,
        #"{"exp":9223372036854775807}"#,
    ])
    func anExpNoDurationHoldsIsABadResponse(_ payload: String) {
        #expect(fileFailure(jwt(payload: payload))?.description == "bad_response")
    }

    @Test func anExpMoreThanAYearAwayIsABadResponseAndAYearIsFine() throws {
        let now = 1_800_000_000
        #expect(fileFailure(jwt(payload: #"{"exp":\#(now + 100 * 31_536_000)}"#))?.description == "bad_response")
        #expect(fileFailure(jwt(payload: #"{"exp":\#(now + 31_536_001)}"#))?.description == "bad_response")
        #expect(try fetch(jwt(payload: #"{"exp":\#(now + 31_536_000)}"#)).lifetime == .seconds(31_536_000))
        #expect(
            fileFailure(jwt(payload: #"{"exp":\#(now)}"#))?.description == "bad_response", "an expired token is refused"
        )
    }

    // MARK: - a JWT's exp, whatever the source

    /// Claims a reader could take two ways, or whose `exp` is not a NumericDate: a token made so
    /// was served without expiry (`http`), with the default lifetime (`oauth2`) or `lifetimeSec`
    /// (`file`), as if it were not a JWT.
    static let claimsThatAreNoJWTs = [
        #"{"exp":1800000100,"exp":1799996400}"#, #"{"exp":"1799996400"}"#, #"{"exp":null}"#, #"{"exp":[1800000100]}"#,
        #"{"exp":1800000100,}"#, #"{"exp":1800000100"#, #"["exp",1800000100]"#, #"not json"#,
    ]

    @Test(arguments: claimsThatAreNoJWTs)
    func aJWTWhoseClaimsAreNotOneStrictObjectWithANumericExpIsABadResponseFromEverySource(_ claims: String) {
        let token = jwt(payload: claims)
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        #expect(fileFailure(token, lifetimeSec: 60)?.description == "bad_response", "file")
        var settings = HTTPSourceConfiguration(url: "http://127.0.0.1:1/t")
        settings.expiresInPointer = "/ttl"
        let http = HTTPTokenSource(configuration: settings)
        for body in [#"{"access_token":"\#(token)"}"#, #"{"access_token":"\#(token)","ttl":60}"#] {
            var failure: TokenFetchError?
            do { _ = try http.token(from: answer(body), now: now) } catch { failure = error }
            #expect(failure?.description == "bad_response", "http \(body)")
        }
        for body in [#"{"access_token":"\#(token)"}"#, #"{"access_token":"\#(token)","expires_in":60}"#] {
            #expect(oauthFailure(body, now: now) == "bad_response", "oauth2 \(body)")
        }
    }

    @Test func aHeaderThatIsNoJSONObjectIsABadResponseAndATokenThatDoesNotOpenOneIsOpaque() throws {
        let claims = #"{"exp":1799996400}"#
        let duplicateHeader = Self.base64URL(#"{"alg":"none","alg":"HS256"}"#) + "." + Self.base64URL(claims) + ".c2ln"
        #expect(fileFailure(duplicateHeader, lifetimeSec: 60)?.description == "bad_response")
        for opaque in ["abc.def.ghi", Self.base64URL("[1]") + "." + Self.base64URL(claims) + ".c2ln", "a.b", "a.b.c.d"]
        {
            #expect(try fetch(opaque, lifetimeSec: 60).lifetime == .seconds(60), "\(opaque)")
        }
    }

    @Test func anOAuthAnswerWithoutExpiresInLivesUntilItsJWTsExpAndAnExpPastIsABadResponse() throws {
        let now = WallTime(timeIntervalSince1970: 1_800_000_000)
        let live = jwt(payload: #"{"sub":"s","exp":1800000120}"#)
        let token = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"\#(live)"}"#), defaultLifetime: 3600, now: now)
        #expect(token.lifetime == .seconds(120))
        let expired = jwt(payload: #"{"sub":"s","exp":1799996400}"#)
        #expect(oauthFailure(#"{"access_token":"\#(expired)"}"#, now: now) == "bad_response")
        #expect(oauthFailure(#"{"access_token":"\#(expired)","expires_in":null}"#, now: now) == "bad_response")
        // A stated lifetime counts from the answer, so it is taken whatever the clocks say.
        let stated = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"\#(expired)","expires_in":300}"#), defaultLifetime: 3600, now: now)
        #expect(stated.lifetime == .seconds(300))
        let opaque = try OAuth2TokenSource.token(
            from: answer(#"{"access_token":"opaque"}"#), defaultLifetime: 3600, now: now)
        #expect(opaque.lifetime == .seconds(3600))
    }

    private func oauthFailure(_ body: String, now: WallTime) -> String? {
        do {
            _ = try OAuth2TokenSource.token(from: answer(body), defaultLifetime: 3600, now: now)
            return nil
        } catch {
            return error.description
        }
    }

    /// The file source gets the rules of `oauth2` and `http`: visible ASCII, at most 16 KiB.
    @Test(arguments: [
        "tok\u{1}en", "tok\u{0}en", "tok\u{7F}en", "caf\u{E9}", String(repeating: "a", count: 16 * 1024 + 1),
    ])
    func aFileTokenThatCannotTravelInAHeaderIsABadResponse(_ contents: String) {
        #expect(fileFailure(contents, lifetimeSec: 60)?.description == "bad_response")
    }

    @Test func aFileTokenOfSixteenKiBIsFine() throws {
        #expect(try fetch(String(repeating: "a", count: 16 * 1024), lifetimeSec: 60).lifetime == .seconds(60))
    }
}
