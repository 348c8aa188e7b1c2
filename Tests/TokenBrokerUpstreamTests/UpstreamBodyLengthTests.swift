import Foundation
import Synchronization
import Testing
import TokenBrokerCore

@testable import TokenBrokerUpstream

/// A streamed request body reaches the upstream exactly as long as declared, whatever the body's
/// source has to give: a longer one would put a second request on a pooled connection.
@Suite struct UpstreamBodyLengthTests {
    @Test func aStreamedBodyNeverSendsMoreThanItsDeclaredLength() async throws {
        let server = try CannedServer(
            answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", wholeRequest: true)
        let smuggled = Array("helloGET /admin/delete-everything HTTP/1.1\r\nHost: upstream\r\nX-Swallow: ".utf8)
        let delegate = Delegate(body: smuggled)
        let request = UpstreamRequest(
            method: "POST", url: "http://127.0.0.1:\(server.port)/upload", settings: UpstreamConfiguration())
        UpstreamHTTPClient.shared.start(
            UpstreamExchange(request: request, streamsBody: true, bodyLength: 5, delegate: delegate))
        let received = try #require(await server.received(timeout: .seconds(20)))
        let text = String(decoding: received, as: UTF8.self)
        let parts = text.components(separatedBy: "\r\n\r\n")
        #expect(parts.count == 2, "one head, then the body: \(text)")
        #expect(parts.first?.lowercased().contains("content-length: 5") == true)
        #expect(parts.last == "hello")
        #expect(!text.contains("/admin/delete-everything"))
        #expect(await delegate.finished(timeout: .seconds(20)))
    }

    @Test func aStreamedBodyThatEndsShortStopsTheExchange() async throws {
        let server = try CannedServer(
            answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", wholeRequest: true)
        let delegate = Delegate(body: Array("abc".utf8))
        let request = UpstreamRequest(
            method: "POST", url: "http://127.0.0.1:\(server.port)/upload", settings: UpstreamConfiguration())
        UpstreamHTTPClient.shared.start(
            UpstreamExchange(request: request, streamsBody: true, bodyLength: 10, delegate: delegate))
        let received = try #require(await server.received(timeout: .seconds(20)))
        let body = String(decoding: received, as: UTF8.self).components(separatedBy: "\r\n\r\n").last ?? ""
        #expect(body == "abc", "the upstream saw the connection end after what there was")
        #expect(await delegate.finished(timeout: .seconds(20)))
        #expect(delegate.error != nil, "an exchange whose body ended short is a failure, not an answer")
    }

    /// A client gone before its loop took the exchange up: the request never leaves (the
    /// cancel command alone came too early to find the transfer, which then started).
    @Test func anExchangeCancelledBeforeItStartsNeverReachesTheServer() async throws {
        let server = try CannedServer(answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        let delegate = Delegate(body: [])
        let request = UpstreamRequest(
            method: "GET", url: "http://127.0.0.1:\(server.port)/x", settings: UpstreamConfiguration())
        let exchange = UpstreamExchange(request: request, streamsBody: false, bodyLength: nil, delegate: delegate)
        exchange.cancel()
        // Let the loop take the cancel command up first, with no transfer to find yet (with the
        // fix the test passes whatever the timing; without it, this pause makes it fail).
        try await Task.sleep(for: .milliseconds(200))
        UpstreamHTTPClient.shared.start(exchange)
        #expect(await delegate.finished(timeout: .seconds(20)))
        #expect(delegate.error == .stopped)
        #expect(await server.received(timeout: .seconds(2)) == nil, "the server was never asked")
    }
}

/// Hands out a fixed body once, then its end; records how the exchange finished.
private final class Delegate: UpstreamExchangeDelegate, @unchecked Sendable {
    private let state: Lock<(body: [UInt8], done: Bool, error: UpstreamError?)>

    init(body: [UInt8]) { state = Lock((body, false, nil)) }

    var error: UpstreamError? { state.withLock { $0.error } }

    func upstreamHead(
        status: Int, headers: [(String, [UInt8])], length: Int64?, body: UnsafeRawBufferPointer, complete: Bool
    ) -> Bool { true }
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool { true }
    func upstreamFinished(_ error: UpstreamError?) {
        state.withLock {
            $0.done = true
            $0.error = error
        }
    }

    func upstreamReadBody(into buffer: UnsafeMutableRawBufferPointer) -> UpstreamBodyRead {
        state.withLock { state in
            guard !state.body.isEmpty else { return .end }
            let count = min(buffer.count, state.body.count)
            buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: state.body.withUnsafeBytes { $0 }[0..<count]))
            state.body.removeFirst(count)
            return .bytes(count)
        }
    }

    func finished(timeout: Duration) async -> Bool {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if state.withLock({ $0.done }) { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return false
    }
}
