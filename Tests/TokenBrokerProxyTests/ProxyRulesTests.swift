import Testing
import TokenBrokerAPI
import TokenBrokerServer

@testable import TokenBrokerCore
@testable import TokenBrokerProxy

/// The rules that keep proxy mode from being an open proxy, and the headers that cross it.
@Suite struct ProxyRulesTests {
    @Test(
        arguments: [
            ("/proxy/api/", "api", "/", nil),
            ("/proxy/api/a/b", "api", "/a/b", nil),
            ("/proxy/api/a/b/", "api", "/a/b/", nil),
            ("/proxy/api/a/./b/../c?x=1&y=%2F", "api", "/a/c", "x=1&y=%2F"),
            ("/proxy/api/a/%2e%2E/b", "api", "/b", nil),
            ("/proxy/api/a/b/..", "api", "/a/", nil),
            ("/proxy/api/a%20b/c:d@e", "api", "/a%20b/c:d@e", nil),
            ("/proxy/api", "api", "/", nil),
            ("/proxy/api?q", "api", "/", "q"),
            // Parameters after other segments, and dots after parameters, are no dot segment.
            ("/proxy/api/a;b/../c", "api", "/c", nil),
            ("/proxy/api/...;x/;../x;..", "api", "/...;x/;../x;..", nil),
        ] as [(String, String, String, String?)])
    func targetsInsideTheProxyAreNormalised(_ raw: String, _ proxy: String, _ path: String, _ query: String?) throws {
        let target = try ProxyPath.parse(raw).get()
        #expect(target == ProxyRequestTarget(proxy: proxy, path: path, query: query))
    }

    @Test(arguments: [
        ("http://evil/proxy/api/x", ProxyPathProblem.absoluteForm),
        ("*", .absoluteForm),
        ("/token", .notUnderProxy),
        ("/proxy//x", .notUnderProxy),
        ("/proxy/api/..", .escapesRoot),
        ("/proxy/api/a/../../b", .escapesRoot),
        ("/proxy/api/%2e%2e/x", .escapesRoot),
        ("/proxy/api/a%2fb", .encodedSeparator),
        ("/proxy/api/a%5Cb", .encodedSeparator),
        ("/proxy/api/a%0d%0aX:1", .encodedSeparator),
        ("/proxy/api/a%00", .encodedSeparator),
        ("/proxy/api/a b", .badCharacters),
        ("/proxy/api/a\\b", .badCharacters),
        ("/proxy/api/%zz", .badCharacters),
        ("/proxy/api/%4", .badCharacters),
        ("/proxy/api/é", .badCharacters),
        ("/proxy/api/a?b=<script>", .badCharacters),
        // Tomcat drops a segment's parameters, then resolves: `..;` is `..` there.
        ("/proxy/api/..;/x", .dotSegmentWithParameters),
        ("/proxy/api/a/..;x=1/b", .dotSegmentWithParameters),
        ("/proxy/api/a/%2e%2E;/b", .dotSegmentWithParameters),
        ("/proxy/api/a/.%2e%3B/b", .dotSegmentWithParameters),
        ("/proxy/api/.;/../x", .dotSegmentWithParameters),
        ("/proxy/api/a/..;", .dotSegmentWithParameters),
    ])
    func escapesAndTricksAreRefused(_ raw: String, _ problem: ProxyPathProblem) {
        #expect(throws: problem) { try ProxyPath.parse(raw).get() }
    }

    /// RFC 9110 §7.6.2: `Max-Forwards = 1*DIGIT`, given once; a number past what the broker
    /// supports counts as its most, not as an error or a wrap-around.
    @Test(
        arguments: [
            ([("Max-Forwards", "0")], ProxyAPI.MaxForwards.hops(0)),
            ([("max-forwards", "07")], .hops(7)),
            ([("Max-Forwards", "99999999999999999999999")], .hops(ProxyAPI.mostHops)),
            ([("Accept", "*/*")], .absent),
            ([("Max-Forwards", "1"), ("Max-Forwards", "1")], .malformed),
            ([("Max-Forwards", "+1")], .malformed),
            ([("Max-Forwards", "1 2")], .malformed),
            ([("Max-Forwards", "")], .malformed),
        ])
    func maxForwardsIsOneWholeNumber(_ headers: [(String, String)], _ expected: ProxyAPI.MaxForwards) {
        #expect(ProxyAPI.maxForwards(HTTPFields(headers.map { ($0.0, $0.1) })) == expected)
    }

    /// A 304's `Content-Length` goes on as the length of the body it stands for: only when it is
    /// RFC 9110's `1*DIGIT` (a sign is not), and below libmicrohttpd's "unknown" (2^64 - 1).
    @Test(
        arguments: [
            ("1234", UInt64?(1234)), (" 7 ", 7), ("0005", 5), ("18446744073709551614", 18_446_744_073_709_551_614),
            ("+5", nil), ("-0", nil), ("12, 12", nil), ("", nil), ("18446744073709551615", nil),
            ("99999999999999999999", nil),
        ])
    func aNotModifiedLengthIsDigitsOnly(_ value: String, _ expected: UInt64?) {
        #expect(
            ProxyExchange.declaredLength([("ETag", Array("\"e\"".utf8)), ("Content-Length", Array(value.utf8))])
                == expected)
    }

    @Test func theTargetIsCheckedAndJoined() throws {
        let target = try ProxyTarget(parsing: "https://api.example.com:8443/v1/")
        #expect(target.url(path: "/users/7", query: "a=1") == "https://api.example.com:8443/v1/users/7?a=1")
        for bad in [
            "ftp://x", "https://user@x/", "https://x/?q", "https://x/#f", "https://x/a/../b", "https://", "https://x /",
            "https://x:0/", "https://x:65536/", "https://x:abc/", "https://x:/", "https://[::1/", "https://ex%41mple/",
        ] {
            #expect(throws: ConfigurationError.self) { try ProxyTarget(parsing: bad) }
        }
        for good in ["http://[::1]:8080/v1", "http://orders_api", "https://x:65535/"] {
            #expect(throws: Never.self) { try ProxyTarget(parsing: good) }
        }
        // A password holding '/' ends the authority early; the message does not show it.
        do {
            _ = try ProxyTarget(parsing: "https://user:pa/ss-42@api.example/v1")
            Issue.record("a user-info part is refused")
        } catch {
            #expect(error.message.hasPrefix("has user information"))
            #expect(!error.message.contains("ss-42"))
        }
    }

    @Test func theTokenGoesInAsConfiguredAndHopByHopHeadersStay() {
        let sent: [(String, String)] = [
            ("Host", "evil"), ("Connection", "keep-alive, X-Private"), ("X-Private", "p"), ("Keep-Alive", "5"),
            ("Token-Broker-Request", "true"), ("Authorization", "Bearer caller"), ("Cookie", "a=1; tok=old"),
            ("Accept", "*/*"),
            ("Transfer-Encoding", "chunked"), ("Content-Length", "3"), ("TE", "trailers"),
        ]
        func forwarded(_ injection: ProxyConfiguration.Injection, overwrite: Bool = true, callerKey: Bool = false)
            -> [String: String]
        {
            Dictionary(
                ProxyHeaders.forward(
                    bytes(sent), token: "T", injection: injection, overwrite: overwrite, cookieName: "tok",
                    callerKeyInAuthorization: callerKey
                ).map { ($0.0.lowercased(), String(decoding: $0.1, as: UTF8.self)) }
            ) { a, _ in a }
        }
        let bearer = forwarded(.authorization)
        #expect(bearer["authorization"] == "Bearer T" && bearer["accept"] == "*/*")
        for gone in [
            "host", "connection", "x-private", "keep-alive", "token-broker-request", "transfer-encoding",
            "content-length", "te",
        ] {
            #expect(bearer[gone] == nil, "\(gone)")
        }
        #expect(forwarded(.authorization, overwrite: false)["authorization"] == "Bearer caller")
        #expect(forwarded(.authorization, overwrite: false, callerKey: true)["authorization"] == "Bearer T")
        #expect(forwarded(.cookie)["cookie"] == "a=1; tok=T" && forwarded(.cookie)["authorization"] == "Bearer caller")
        #expect(forwarded(.cookie, overwrite: false)["cookie"] == "a=1; tok=old")
        #expect(forwarded(.header("X-Token"))["x-token"] == "T")
        #expect(forwarded(.header("X-Token"), callerKey: true)["authorization"] == nil)

        let back = ProxyHeaders.back(
            bytes([
                ("Content-Length", "9"), ("Set-Cookie", "a"), ("Set-Cookie", "b"), ("Connection", "X-H"), ("X-H", "1"),
                ("Date", "d"),
            ]))
        #expect(back.map(\.0) == ["Set-Cookie", "Set-Cookie"])
    }

    @Test func proxyHeadersInAnyCaseStayAndNamesThatOnlyStartAlikeGo() {
        let sent: [(String, String)] = [
            ("Proxy", "http://evil"), ("PROXY-Authorization", "Basic x"), ("proxy-foo", "1"), ("Proxy-", "2"),
            ("Proxyx", "3"), ("Proxies", "4"), ("X-Proxy", "5"), ("Prox", "6"), ("TE", "trailers"), ("Te-X", "7"),
            ("UPGRADE", "h2c"), ("Upgrades", "8"),
        ]
        let forwarded = ProxyHeaders.forward(
            bytes(sent), token: "T", injection: .authorization, overwrite: true, cookieName: "tok",
            callerKeyInAuthorization: false)
        #expect(forwarded.map(\.0) == ["Proxyx", "Proxies", "X-Proxy", "Prox", "Te-X", "Upgrades", "Authorization"])
        let back = ProxyHeaders.back(
            bytes(
                sent + [
                    ("CONNECTION", "x-one ,X-Two"), ("X-One", "1"), ("x-two", "2"), ("Connection", " ,\tX-Three\t, "),
                    ("X-THREE", "3"),
                ]))
        // Answers lose `Proxy` and `Proxy-*` too (`Proxy-Status`, `Proxy-Authentication-Info`),
        // the hop-by-hop ones, and those `Connection` names.
        #expect(back.map(\.0) == ["Proxyx", "Proxies", "X-Proxy", "Prox", "Te-X", "Upgrades"])
        let status = ProxyHeaders.back(bytes([("Proxy-Status", "x; error=y"), ("proxy-authentication-info", "a=b")]))
        #expect(status.isEmpty)
    }

    /// obs-text (RFC 9110 §5.5): values cross as the bytes sent, in both directions, whatever
    /// else is done to the headers around them.
    @Test func valuesThatAreNotUTF8CrossUnchanged() {
        let latin1: [UInt8] = Array("caf".utf8) + [0xE9, 0x20, 0xFF]
        let utf8: [UInt8] = Array("caf".utf8) + [0xC3, 0xA9]
        let cookie: [UInt8] = Array("a=".utf8) + [0xE9] + Array("; tok=old;b=\t".utf8) + [0xFF]
        let sent: [ProxyHeaders.Field] = [
            ("X-Latin1", latin1), ("X-UTF8", utf8), ("Cookie", cookie), ("Connection", [0xE9] + Array(", X-Hop".utf8)),
            ("X-Hop", latin1),
        ]
        for injection in [ProxyConfiguration.Injection.authorization, .header("X-Token"), .cookie] {
            let forwarded = ProxyHeaders.forward(
                sent, token: "T", injection: injection, overwrite: true, cookieName: "tok",
                callerKeyInAuthorization: false)
            #expect(forwarded.first { $0.0 == "X-Latin1" }?.1 == latin1, "\(injection)")
            #expect(forwarded.first { $0.0 == "X-UTF8" }?.1 == utf8, "\(injection)")
            #expect(!forwarded.contains(named: "X-Hop"), "Connection still names its headers")
            let expectedCookie =
                injection == .cookie ? Array("a=".utf8) + [0xE9] + Array("; tok=T; b=\t".utf8) + [0xFF] : cookie
            #expect(forwarded.first { $0.0 == "Cookie" }?.1 == expectedCookie, "\(injection)")
        }
        let back = ProxyHeaders.back(sent)
        #expect(back.map(\.0) == ["X-Latin1", "X-UTF8", "Cookie"])
        #expect(back.map(\.1) == [latin1, utf8, cookie])
    }

    /// The token's cookie, put among the caller's as bytes: blanks and empty pairs tidied, a
    /// cookie whose name only begins like the token's left alone, the caller's kept with
    /// `overwrite: false`.
    @Test func theTokensCookieIsPutAmongTheCallersBytes() {
        func cookie(_ sent: [ProxyHeaders.Field], overwrite: Bool = true) -> [UInt8]? {
            ProxyHeaders.forward(
                sent, token: "T", injection: .cookie, overwrite: overwrite, cookieName: "tok",
                callerKeyInAuthorization: false
            ).first { $0.0.equalsIgnoringASCIICase("Cookie") }?.1
        }
        #expect(cookie([("Accept", Array("*/*".utf8))]) == Array("tok=T".utf8), "no Cookie: one is added")
        let messy: [UInt8] = Array("tokx=1;; tok=old ; \t".utf8) + [0xFF]
        #expect(cookie([("cookie", messy)]) == Array("tokx=1; tok=T; ".utf8) + [0xFF])
        #expect(cookie([("Cookie", messy)], overwrite: false) == messy, "the caller's cookie header untouched")
        #expect(cookie([("Cookie", [0xE9] + Array("=1".utf8))]) == [0xE9] + Array("=1; tok=T".utf8))
    }

    /// RFC 6265 §5.4: one `Cookie` header. The caller's several become one before the token goes
    /// in, so that its cookie of the token's name is replaced in whichever it came, and no
    /// second header carries it past the token (`Cookie: a=1` and `Cookie: tok=EVIL` reached the
    /// upstream as `a=1; tok=T` and `tok=EVIL`).
    @Test func theCallersCookieHeadersBecomeOneAndTheTokensNameIsReplacedInAnyOfThem() {
        let sent: [ProxyHeaders.Field] = [
            ("Cookie", Array("a=1".utf8)), ("X-Other", Array("x".utf8)), ("cookie", Array("tok=EVIL; b=2".utf8)),
            ("COOKIE", Array("tok=again".utf8)),
        ]
        let forwarded = ProxyHeaders.forward(
            sent, token: "T", injection: .cookie, overwrite: true, cookieName: "tok", callerKeyInAuthorization: false)
        let cookies = forwarded.filter { $0.0.equalsIgnoringASCIICase("Cookie") }.map(\.1)
        #expect(cookies == [Array("a=1; tok=T; b=2".utf8)])
        #expect(forwarded.map(\.0) == ["Cookie", "X-Other"])
        let kept = ProxyHeaders.forward(
            sent, token: "T", injection: .cookie, overwrite: false, cookieName: "tok", callerKeyInAuthorization: false)
        #expect(kept.map(\.1) == sent.map(\.1), "overwrite: false leaves the caller's cookies as they came")
        let added = ProxyHeaders.forward(
            [("Cookie", Array("a=1".utf8)), ("Cookie", Array("b=2".utf8))], token: "T", injection: .cookie,
            overwrite: false, cookieName: "tok", callerKeyInAuthorization: false)
        #expect(added.map(\.1) == [Array("a=1; b=2; tok=T".utf8)])
    }

    /// `Connection` options are tokens (RFC 9110 §7.6.1): one with a byte beyond ASCII names no
    /// header, not even one whose name it lowercases to (U+212A, the Kelvin sign, lowercases to
    /// `k`).
    @Test func aConnectionOptionThatIsNoTokenNamesNoHeader() {
        let sent: [ProxyHeaders.Field] = [
            ("Connection", Array("X-\u{212A}ey, x-hop".utf8)), ("X-Key", Array("1".utf8)), ("X-Hop", Array("2".utf8)),
        ]
        #expect(ProxyHeaders.back(sent).map(\.0) == ["X-Key"])
    }

    @Test func proxiesAreConfiguredStrictly() throws {
        let good =
            #"{"proxies": [{"name": "api", "target": "https://api.example.com/v1", "inject": "header:X-Api-Token", "overwrite": false, "retryOn": [202, 405], "retryOnHeader": "X-Amzn-Waf-Action"}]}"#
        let proxy = try BrokerConfiguration(json: Array(good.utf8)).proxies[0]
        #expect(proxy.inject == .header("X-Api-Token") && !proxy.overwrite && proxy.retryOn == [202, 405])
        #expect(
            proxy.retryOnHeader == "x-amzn-waf-action" && proxy.upstream.timeoutMsec == 30_000
                && proxy.bufferBodyBytes == 65_536)
        let problems = [
            (#"{"proxies": [{"name": "api"}]}"#, "proxies[0].target: is required"),
            (#"{"proxies": [{"name": "a/b", "target": "http://x"}]}"#, "proxies[0].name"),
            (#"{"proxies": [{"name": "a", "target": "http://x", "inject": "header:Host"}]}"#, "cannot carry the token"),
            (
                #"{"proxies": [{"name": "a", "target": "http://x", "inject": "query"}]}"#,
                "allowed: authorization, cookie, header:<name>"
            ),
            (#"{"proxies": [{"name": "a", "target": "http://x", "retryOn": [999]}]}"#, "proxies[0].retryOn[0]"),
            (
                #"{"proxies": [{"name": "a", "target": "http://x", "provider": "nope"}]}"#,
                "no provider is named \"nope\""
            ),
            (
                #"{"proxies": [{"name": "a", "target": "http://x"}, {"name": "a", "target": "http://y"}]}"#,
                "duplicate proxy name"
            ),
            (#"{"proxies": [{"name": "a", "target": "http://x", "retry": [401]}]}"#, "proxies[0].retry: unknown key"),
        ]
        for (json, needle) in problems {
            do {
                _ = try BrokerConfiguration(json: Array(json.utf8))
                Issue.record("accepted \(json)")
            } catch {
                #expect(error.description.contains(needle), "\(error.description)")
            }
        }
    }
}

/// Headers given as text, as the proxy gets them: values as bytes.
private func bytes(_ headers: [(String, String)]) -> [ProxyHeaders.Field] {
    headers.map { ($0.0, Array($0.1.utf8)) }
}
