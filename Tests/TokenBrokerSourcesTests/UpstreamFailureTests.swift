import Testing
import TokenBrokerCore
import TokenBrokerSources

/// How sources classify the upstream client's failures: the texts logs, metrics and `/status` show.
@Suite struct UpstreamFailureTests {
    @Test func sourcesClassifyEachFailureWithTheSameTexts() {
        #expect(
            TokenFetchError(.unreachable("Couldn't connect to server")).summary
                == "unreachable: Couldn't connect to server")
        #expect(TokenFetchError(.timeout("Timeout was reached")).summary == "timeout: Timeout was reached")
        #expect(TokenFetchError(.tooLarge(limit: 1024)).summary == "bad_response: the answer is larger than 1024 bytes")
        #expect(
            TokenFetchError(.settingsRefused).summary
                == "configuration: libcurl refused the request's settings (check caFile and the client certificate)")
        #expect(
            TokenFetchError(.unreadableFile("caFile: cannot read /etc/ca.pem: is a FIFO, not a regular file")).summary
                == "configuration: caFile: cannot read /etc/ca.pem: is a FIFO, not a regular file")
        #expect(TokenFetchError(.clientFailure("curl_easy_init failed")).summary == "internal: curl_easy_init failed")
        #expect(TokenFetchError(.stopped).description == "internal")
    }
}
