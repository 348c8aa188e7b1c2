// Every error answer: status, `error` code, description and the headers that matter.
import Testing
import TokenBrokerCore
import TokenBrokerServer

@testable import TokenBrokerAPI

@Suite struct ErrorAnswerTests {
    /// Each answer with its status, code and headers; descriptions where they hold values.
    static let table: [(ErrorAnswer, Int, String, [String: String])] = [
        (.notFound(path: "/x"), 404, "not_found", [:]),
        (.methodNotAllowed(method: "PUT", allow: ["GET", "HEAD"]), 405, "method_not_allowed", ["Allow": "GET, HEAD"]),
        (.absoluteForm, 400, "invalid_request", [:]),
        (.unknownProvider(name: "p"), 404, "unknown_provider", [:]),
        (.malformedHead(problem: "bad"), 400, "invalid_request", ["Connection": "close"]),
        (.tooManyQueryArguments, 414, "uri_too_long", ["Connection": "close"]),
        (.headTooLarge, 431, "request_header_fields_too_large", ["Connection": "close"]),
        (.shuttingDown, 503, "shutting_down", ["Retry-After": "1"]),
        (.refusedWhileStopping, 503, "shutting_down", ["Retry-After": "1", "Connection": "close"]),
        (.missingRequestHeader, 403, "missing_request_header", [:]),
        (.forwardedRequest, 403, "forwarded_request", [:]),
        (.missingCallerKey, 401, "missing_caller_key", ["WWW-Authenticate": #"Bearer realm="token-broker""#]),
        (
            .invalidCallerKey, 401, "invalid_caller_key",
            ["WWW-Authenticate": #"Bearer realm="token-broker", error="invalid_token""#]
        ),
        (.providerNotAllowed(caller: "c", provider: "p"), 403, "provider_not_allowed", [:]),
        (.notAWholeNumber(parameter: "after"), 400, "invalid_request", [:]),
        (.invalidTimeout(minimum: 0), 400, "invalid_request", [:]),
        (.repeatedParameter("after"), 400, "invalid_request", [:]),
        (.bodyTooLarge, 413, "payload_too_large", [:]),
        (.refreshBodyNotObject, 400, "invalid_request", [:]),
        (.refreshBodyUnknownKey("k"), 400, "invalid_request", [:]),
        (.invalidRejectedVersion, 400, "invalid_request", [:]),
        (
            .tokenUnavailable(provider: "p", lastError: nil, paused: false), 503, "token_unavailable",
            ["Retry-After": "1"]
        ),
        (
            .tokenUnavailable(
                provider: "p", lastError: .rateLimited("x", httpStatus: 429, retryAfter: .seconds(600)), paused: false,
                retryAfter: .seconds(42)),
            503, "token_unavailable", ["Retry-After": "42"]
        ),
        (
            .excessiveRefresh(provider: "p", attempts: 5, windowSeconds: 30, retryAfter: .milliseconds(1)), 429,
            "excessive_refresh", ["Retry-After": "1"]
        ),
        (.invalidProxyPath(.badCharacters), 400, "invalid_request", [:]),
        (.invalidProxyPath(.escapesRoot), 400, "invalid_request", [:]),
        (.invalidProxyPath(.encodedSeparator), 400, "invalid_request", [:]),
        (.unknownProxy(name: "x"), 404, "unknown_proxy", [:]),
        (
            .methodNotForwarded(method: "TRACE", allow: ["GET", "POST"]), 405, "method_not_allowed",
            ["Allow": "GET, POST"]
        ),
        (.proxyBodyTooLarge(proxy: "api", maxBytes: 10), 413, "payload_too_large", [:]),
        (.proxyTokenUnavailable(proxy: "api", provider: "p"), 503, "token_unavailable", ["Retry-After": "1"]),
        // What is left of the issuer's Retry-After, as on the token routes; not always 1.
        (
            .proxyTokenUnavailable(
                proxy: "api", provider: "p", lastError: .rateLimited("x", httpStatus: 503, retryAfter: .seconds(120)),
                retryAfter: .milliseconds(118_200)),
            503, "token_unavailable", ["Retry-After": "119"]
        ),
        (.tokenNotCookieSafe(proxy: "api", provider: "p"), 502, "token_not_cookie_safe", [:]),
        (.upstreamTimeout(proxy: "api", timeoutMsec: 2500), 504, "upstream_timeout", [:]),
        (.upstreamUnreachable(proxy: "api", problem: nil), 502, "upstream_unreachable", [:]),
        (.requestValue(.init(parameter: .audience, kind: .notAccepted), provider: "p"), 400, "invalid_request", [:]),
        (.requestValue(.init(parameter: .scope, kind: .malformed), provider: "p"), 400, "invalid_request", [:]),
        (.requestValue(.init(parameter: .resource, kind: .notAllowed), provider: "p"), 400, "value_not_allowed", [:]),
        (.requestValue(.init(parameter: .audience, kind: .missing), provider: "p"), 400, "invalid_request", [:]),
        (
            .tooManyChildren(provider: "t", limit: 100, retryAfter: .milliseconds(1500)), 503, "too_many_children",
            ["Retry-After": "2"]
        ),
    ]

    @Test func everyAnswerHasItsStatusCodeAndHeaders() {
        for (answer, status, code, headers) in Self.table {
            #expect(answer.status == status && answer.code == code, "\(answer)")
            expectError(answer.response, status, code, headers: headers)
            #expect(answer.response.header("Cache-Control") == "no-store")
            #expect(answer.response.string("error_description") == answer.description)
        }
    }

    @Test func theBodyIsTheErrorShapeByteForByte() {
        #expect(
            ErrorAnswer.missingCallerKey.response.bodyText
                == #"{"error":"missing_caller_key","error_description":"token routes need a caller key: send Authorization: Bearer <key>"}"#
        )
        #expect(
            ErrorAnswer.notFound(path: #"/a"b"#).response.bodyText
                == #"{"error":"not_found","error_description":"no route for /a\"b"}"#)
    }

    @Test func aRequestValuesAnswerNamesItsParameter() {
        #expect(
            ErrorAnswer.requestValue(.init(parameter: .audience, kind: .notAllowed), provider: "orders").response
                .bodyText
                == #"{"error":"value_not_allowed","error_description":"provider \"orders\" does not allow this audience (see its allow-list)","parameter":"audience"}"#
        )
        #expect(
            ErrorAnswer.requestValue(.init(parameter: .scope, kind: .notAccepted), provider: "plain").description
                == #"provider "plain" does not take scope (see perRequest)"#)
        #expect(
            ErrorAnswer.requestValue(.init(parameter: .resource, kind: .malformed), provider: "t").description
                == "resource must be 1 to 1024 visible ASCII characters, without spaces")
        #expect(
            ErrorAnswer.requestValue(.init(parameter: .scope, kind: .missing), provider: "custom").response.bodyText
                == #"{"error":"invalid_request","error_description":"scope is required by this template: provider \"custom\" has no default for it","parameter":"scope"}"#
        )
        #expect(
            ErrorAnswer.tooManyChildren(provider: "t", limit: 3, retryAfter: .seconds(59)).description
                == #"provider "t" keeps at most 3 children (maxChildren) and has no room for another; try again in 59 s"#
        )
        // Other answers carry no parameter member.
        #expect(ErrorAnswer.repeatedParameter("audience").response.members["parameter"] == nil)
    }

    @Test func constantAnswersAreBuiltOnce() {
        #expect(ErrorAnswer.shuttingDown.response === ErrorAnswer.shuttingDown.response)
        #expect(ErrorAnswer.missingRequestHeader.response === ErrorAnswer.missingRequestHeader.response)
    }

    @Test func descriptionsQuoteWhatTheyNameAndCutLongInput() {
        #expect(
            ErrorAnswer.notFound(path: String(repeating: "a", count: 300)).description.count == "no route for ".count
                + 200)
        #expect(
            ErrorAnswer.unknownProvider(name: String(repeating: "n", count: 100)).description
                == "no provider is named \"\(String(repeating: "n", count: 64))\"")
        #expect(
            ErrorAnswer.methodNotAllowed(method: String(repeating: "M", count: 40), allow: ["POST"]).description
                == "\(String(repeating: "M", count: 32)) is not allowed here; allowed: POST")
        #expect(
            ErrorAnswer.refreshBodyUnknownKey("a\"b").description
                == #"unknown key "a\"b" in the body; allowed: rejected_version"#)
        #expect(
            ErrorAnswer.excessiveRefresh(provider: "p", attempts: 5, windowSeconds: 30, retryAfter: .seconds(3))
                .description
                == #"provider "p" allows 5 forced refreshes per 30 s; try again in 3 s"#)
    }

    /// Proxy mode's answers, worded as proxy mode words them today.
    @Test func proxyAnswersKeepTheirWords() {
        #expect(
            ErrorAnswer.methodNotForwarded(method: "TRACE", allow: ["GET", "HEAD"]).description
                == "TRACE is not forwarded; allowed: GET, HEAD")
        #expect(
            ErrorAnswer.proxyBodyTooLarge(proxy: "api", maxBytes: 1024).description
                == #"proxy "api" accepts bodies up to 1024 bytes"#)
        #expect(
            ErrorAnswer.proxyTokenUnavailable(proxy: "api", provider: "p").description
                == #"proxy "api" has no token from provider "p""#)
        #expect(
            ErrorAnswer.tokenNotCookieSafe(proxy: "api", provider: "p").description
                == #"proxy "api": the token of provider "p" holds a character a cookie value cannot (RFC 6265), so it is not sent"#
        )
        #expect(
            ErrorAnswer.upstreamTimeout(proxy: "api", timeoutMsec: 2500).description
                == #"proxy "api": the target did not answer within 2500 ms"#)
        #expect(
            ErrorAnswer.upstreamUnreachable(proxy: "api", problem: nil).description
                == #"proxy "api": the target gave no answer"#)
        #expect(
            ErrorAnswer.upstreamUnreachable(proxy: "api", problem: "refused").description == #"proxy "api": refused"#)
    }

    @Test func theUnavailableTextSaysWhy() {
        #expect(
            ErrorAnswer.tokenUnavailable(provider: "p", lastError: nil, paused: false).description
                == #"provider "p" has no valid token"#)
        let paused = ErrorAnswer.tokenUnavailable(provider: "p", lastError: nil, paused: true).description
        #expect(
            paused
                == #"provider "p" has no valid token; refresh was paused while idle and has resumed: wait for the new token at /token/ready"#
        )
        let failing = ErrorAnswer.tokenUnavailable(provider: "p", lastError: .unreachable("refused"), paused: false)
            .description
        #expect(
            failing
                == #"provider "p" has no valid token; last upstream error: \#(TokenFetchError.unreachable("refused").summary)"#
        )
    }

    /// A proxied request's 503 says the provider's last upstream error, as the token routes' does.
    @Test func theProxysUnavailableTextSaysTheLastUpstreamError() {
        let failing = ErrorAnswer.proxyTokenUnavailable(
            proxy: "api", provider: "p", lastError: .unreachable("refused"), retryAfter: .seconds(3)
        )
        .description
        #expect(
            failing
                == #"proxy "api" has no token from provider "p"; last upstream error: \#(TokenFetchError.unreachable("refused").summary)"#
        )
    }
}
