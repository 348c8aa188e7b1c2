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

/// A loopback server for one connection: reads the request's head, then sends `answer` and
/// closes, or, with no answer, stays silent until the peer closes (at most 30 s).
private final class CannedServer: Sendable {
    let port: UInt16
    private let listener: Int32
    private let state = Mutex<(head: [UInt8]?, peerClosed: Bool)>((nil, false))

    init(answer: String?) throws {
        (listener, port) = try Self.listen()
        let listener = listener
        Thread.detachNewThread { [self] in serve(listener, answer: answer) }
    }

    /// A port on 127.0.0.1 that nothing listens on: bound, then closed.
    static func closedPort() throws -> UInt16 {
        let (fd, port) = try listen()
        close(fd)
        return port
    }

    private static func listen() throws -> (Int32, UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && Glibc.listen(fd, 1) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw POSIXError(.EADDRNOTAVAIL)
        }
        return (fd, UInt16(bigEndian: address.sin_port))
    }

    private func serve(_ listener: Int32, answer: String?) {
        let connection = accept(listener, nil, nil)
        defer {
            close(connection)
            close(listener)
        }
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<20 where !received.ends(with: "\r\n\r\n") {
            let count = recv(connection, &chunk, chunk.count, 0)
            if count <= 0 { break }
            received += chunk[0..<count]
        }
        state.withLock { $0.head = received }
        if let answer {
            _ = answer.withCString { send(connection, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            return
        }
        // Silent: wait for the client to close, a second at a time, for at most 30 s.
        for _ in 0..<30 {
            let count = recv(connection, &chunk, chunk.count, 0)
            if count == 0 {
                state.withLock { $0.peerClosed = true }
                return
            }
            if count < 0 && errno != EAGAIN && errno != EWOULDBLOCK { return }
        }
    }

    /// The request's head, once it came.
    func received(timeout: Duration) async -> [UInt8]? {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if let head = state.withLock({ $0.head }) { return head }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }

    /// Whether the client closed the connection while the server stayed silent.
    func closedByPeer(timeout: Duration) async -> Bool {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if state.withLock({ $0.peerClosed }) { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return false
    }
}

extension [UInt8] {
    fileprivate func ends(with text: String) -> Bool {
        count >= text.utf8.count && suffix(text.utf8.count).elementsEqual(text.utf8)
    }
}
