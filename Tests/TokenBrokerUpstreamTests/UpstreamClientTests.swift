import Foundation
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerUpstream

/// The upstream client's own behaviour: how it reads an answer's head, what it refuses to do,
/// and how each way an exchange can fail is reported. The servers are on 127.0.0.1 only.
@Suite struct UpstreamClientTests {
    private func request(_ server: CannedServer, _ configure: (inout UpstreamConfiguration) -> Void = { _ in })
        -> UpstreamRequest
    {
        var settings = UpstreamConfiguration()
        configure(&settings)
        return UpstreamRequest(method: "GET", url: "http://127.0.0.1:\(server.port)/token", settings: settings)
    }

    /// What `send` threw, or nil when it answered.
    private func failure(of request: UpstreamRequest) async -> UpstreamError? {
        do {
            _ = try await UpstreamHTTPClient.shared.send(request)
            return nil
        } catch {
            return error
        }
    }

    @Test func theFinalAnswersHeadersAreKeptByLowerCaseNameWithoutSurroundingSpace() async throws {
        let server = try CannedServer(
            answer: """
                HTTP/1.1 100 Continue\r
                X-Interim: yes\r
                \r
                HTTP/1.1 429 Too Many Requests\r
                RETRY-after:   7 \r
                X-Mixed-Case:\tvalue with spaces\t\r
                Content-Length: 2\r
                Connection: close\r
                \r
                ok
                """)
        let response = try await UpstreamHTTPClient.shared.send(request(server))
        #expect(response.status == 429)
        #expect(response.headers["x-mixed-case"] == "value with spaces")
        #expect(response.headers["x-interim"] == nil, "an interim answer's headers are forgotten")
        #expect(response.retryAfter == .seconds(7))
        #expect(response.body == Array("ok".utf8))
        let head = String(decoding: try #require(await server.received(timeout: .seconds(20))), as: UTF8.self)
        #expect(head.hasPrefix("GET /token HTTP/1.1\r\n"))
        #expect(!head.lowercased().contains("expect:"), "libcurl's Expect: 100-continue is never sent")
    }

    /// A value goes out as its bytes, UTF-8 or not (the proxy passes on obs-text as it came), an
    /// empty one too; one holding CR or LF, which would start a header of its own, or NUL, which
    /// would end the line early, is left out. A withheld header libcurl would add is not sent.
    @Test func headerValuesAreSentAsTheirBytesAndOnesThatWouldBreakTheLineAreLeftOut() async throws {
        let server = try CannedServer(answer: "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        var sent = request(server)
        let obsText: [UInt8] = Array("caf".utf8) + [0xE9, 0x20, 0xFF]
        sent.headers = [
            ("X-Obs-Text", obsText), ("X-Cr", Array("a\rX-Injected: 1".utf8)),
            ("X-Lf", Array("a\nX-Injected: 2".utf8)), ("X-Nul", Array("a\u{0}b".utf8)), ("X-Empty", []),
            ("X-After", Array("kept".utf8)),
        ]
        sent.withheld = ["Accept"]
        #expect(try await UpstreamHTTPClient.shared.send(sent).status == 204)
        let head = try #require(await server.received(timeout: .seconds(20)))
        let lines = head.split(separator: Array("\r\n".utf8)).map { Array($0) }
        #expect(lines.contains(Array("X-Obs-Text: ".utf8) + obsText))
        #expect(lines.contains(Array("X-After: kept".utf8)))
        #expect(lines.contains(Array("X-Empty:".utf8)), "an empty value is sent")
        #expect(!lines.contains { $0.starts(with: Array("Accept:".utf8)) }, "libcurl's Accept withheld")
        for name in ["x-cr", "x-lf", "x-nul", "x-injected"] {
            #expect(!String(decoding: head, as: UTF8.self).lowercased().contains(name + ":"), "\(name)")
        }
    }

    @Test func aRedirectIsHandedBackNotFollowed() async throws {
        let server = try CannedServer(
            answer: "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/elsewhere\r\nContent-Length: 0\r\n\r\n")
        let response = try await UpstreamHTTPClient.shared.send(request(server))
        #expect(response.status == 302)
        #expect(response.headers["location"] == "http://127.0.0.1:1/elsewhere")
    }

    @Test func aBodyLongerThanTheLimitIsTooLarge() async throws {
        let body = String(repeating: "x", count: 5000)
        let server = try CannedServer(
            answer: "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n" + body)
        let error = await failure(of: request(server) { $0.maxResponseBytes = 1024 })
        #expect(error == .tooLarge(limit: 1024))
    }

    @Test func anAnswerThatDoesNotComeInTimeIsATimeout() async throws {
        let server = try CannedServer(answer: nil)
        let error = await failure(of: request(server) { $0.timeoutMsec = 300 })
        guard case .timeout(let detail)? = error else {
            Issue.record("expected a timeout, got \(String(describing: error))")
            return
        }
        #expect(!detail.isEmpty)
    }

    @Test func aRefusedConnectionIsUnreachable() async throws {
        let port = try CannedServer.closedPort()
        let error = await failure(
            of: UpstreamRequest(method: "GET", url: "http://127.0.0.1:\(port)/", settings: UpstreamConfiguration()))
        guard case .unreachable(let detail)? = error else {
            Issue.record("expected unreachable, got \(String(describing: error))")
            return
        }
        #expect(!detail.isEmpty)
    }

    @Test(arguments: ["file:///etc/passwd", "ftp://127.0.0.1/file", "gopher://127.0.0.1/"])
    func onlyHTTPAndHTTPSAreSpoken(_ url: String) async {
        let error = await failure(of: UpstreamRequest(method: "GET", url: url, settings: UpstreamConfiguration()))
        guard case .unreachable? = error else {
            Issue.record("expected unreachable, got \(String(describing: error))")
            return
        }
    }

    @Test func settingsLibcurlRefusesAreReportedBeforeAnythingIsSent() async {
        // libcurl refuses option strings longer than 8,000,000 bytes (CURL_MAX_INPUT_LENGTH).
        let url = "http://127.0.0.1/" + String(repeating: "a", count: 8_000_001)
        let error = await failure(of: UpstreamRequest(method: "GET", url: url, settings: UpstreamConfiguration()))
        #expect(error == .settingsRefused)
    }

    @Test func aRequestWhoseCallerGivesUpIsStopped() async throws {
        let server = try CannedServer(answer: nil)
        let outcome = Task { await failure(of: request(server)) }
        #expect(await server.received(timeout: .seconds(20)) != nil, "the request reached the server")
        outcome.cancel()
        #expect(await outcome.value == .stopped)
        #expect(await server.closedByPeer(timeout: .seconds(20)), "the connection is closed, not kept for reuse")
    }
}
