import Testing
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerUpstream

@testable import TokenBrokerProxy

/// The proxy's own answers: which failure an upstream exchange amounts to, and the status,
/// `error` code, description and headers each one is answered with. No socket: the parts are
/// read before they become a libmicrohttpd response.
@Suite struct ProxyFailureTests {
    private let settings: ProxyConfiguration = {
        var settings = ProxyConfiguration(
            name: "orders", target: try! ProxyTarget(parsing: "https://orders.example/v1/"))
        settings.maxBodyBytes = 2048
        settings.upstream.timeoutMsec = 1500
        return settings
    }()

    @Test func aTimeoutIs504AndEveryOtherUpstreamFailureIs502WithItsCause() {
        #expect(ProxyFailure(upstream: .timeout("Timeout was reached")) == .upstreamTimeout)
        #expect(
            ProxyFailure(upstream: .unreachable("Couldn't connect to server"))
                == .upstreamUnreachable("unreachable: Couldn't connect to server"))
        #expect(ProxyFailure(upstream: .stopped) == .upstreamUnreachable("internal: stopped"))
        #expect(
            ProxyFailure(upstream: .clientFailure("curl_easy_init failed"))
                == .upstreamUnreachable("internal: curl_easy_init failed"))
        #expect(
            ProxyFailure(upstream: .settingsRefused)
                == .upstreamUnreachable(
                    "configuration: libcurl refused the request's settings (check caFile and the client certificate)"))
        #expect(
            ProxyFailure(upstream: .unreadableFile("caFile: cannot read /etc/ca.pem: is a FIFO, not a regular file"))
                == .upstreamUnreachable("configuration: caFile: cannot read /etc/ca.pem: is a FIFO, not a regular file")
        )
        #expect(
            ProxyFailure(upstream: .tooLarge(limit: 4096))
                == .upstreamUnreachable("bad_response: the answer is larger than 4096 bytes"))
        #expect(ProxyFailure(upstream: nil) == .upstreamUnreachable("the target gave no answer"))
    }

    @Test func eachFailureHasItsStatusCodeAndDescription() {
        let expected: [(ProxyFailure, Int, String, String)] = [
            (.bodyTooLarge, 413, "payload_too_large", #"proxy "orders" accepts bodies up to 2048 bytes"#),
            (
                .tokenNotCookieSafe, 502, "token_not_cookie_safe",
                #"proxy "orders": the token of provider "partner" holds a character a cookie value cannot (RFC 6265), so it is not sent"#
            ),
            (.upstreamTimeout, 504, "upstream_timeout", #"proxy "orders": the target did not answer within 1500 ms"#),
            (
                .upstreamUnreachable("unreachable: Couldn't connect to server"), 502, "upstream_unreachable",
                #"proxy "orders": unreachable: Couldn't connect to server"#
            ),
        ]
        for (failure, status, code, message) in expected {
            let answer = failure.answer(settings, provider: "partner")
            #expect(answer.status == status)
            #expect(answer.code == code)
            #expect(answer.description == message)
            #expect(answer.headers.isEmpty)
            #expect(failure.response(settings, provider: "partner").status == status)
        }
    }

    @Test func aMethodNotForwardedIs405WithAllowListingTheOnesThatAre() {
        let failure = ProxyFailure.methodNotAllowed("TRACE").answer(settings, provider: "partner")
        #expect(failure.status == 405)
        #expect(failure.code == "method_not_allowed")
        #expect(failure.description == "TRACE is not forwarded; allowed: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        #expect(failure.headers.count == 1)
        #expect(
            failure.headers.first?.0 == "Allow"
                && failure.headers.first?.1 == "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        let long = ProxyFailure.methodNotAllowed(String(repeating: "M", count: 100)).answer(
            settings, provider: "partner"
        ).description
        #expect(
            long.hasPrefix(String(repeating: "M", count: 32) + " is not forwarded"),
            "a long method is cut to 32 characters")
    }
}
