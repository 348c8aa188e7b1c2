import Foundation
import Synchronization
import Testing
import TokenBrokerCore

@testable import TokenBrokerUpstream

/// A streamed request body reaches the upstream exactly as long as declared, whatever the body's
/// source has to give: a longer one would put a second request on a pooled connection.
@Suite struct UpstreamBodyLengthTests {
    @Test func aStreamedBodyNeverSendsMoreThanItsDeclaredLength() async throws {
        let server = try OneShotServer()
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
        let server = try OneShotServer()
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
}

/// Hands out a fixed body once, then its end; records how the exchange finished.
private final class Delegate: UpstreamExchangeDelegate, @unchecked Sendable {
    private let state: Lock<(body: [UInt8], done: Bool, error: UpstreamError?)>

    init(body: [UInt8]) { state = Lock((body, false, nil)) }

    var error: UpstreamError? { state.withLock { $0.error } }

    func upstreamHead(status: Int, headers: [(String, String)], length: Int64?) -> Bool { true }
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

/// A loopback server that accepts one connection, reads what comes for a second after the head
/// (or until the peer closes), answers 200 and closes. Runs on a thread of its own.
private final class OneShotServer: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let bytes = Lock<[UInt8]?>(nil)

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else { throw POSIXError(.EADDRNOTAVAIL) }
        listener = fd
        port = UInt16(bigEndian: address.sin_port)
        Thread.detachNewThread { [self] in serve() }
    }

    private func serve() {
        let connection = accept(listener, nil, nil)
        defer {
            close(connection)
            close(listener)
        }
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<100 {
            let count = recv(connection, &chunk, chunk.count, 0)
            if count <= 0 { break }
            received += chunk[0..<count]
        }
        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        _ = answer.withCString { send(connection, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        bytes.withLock { $0 = received }
    }

    func received(timeout: Duration) async -> [UInt8]? {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if let received = bytes.withLock({ $0 }) { return received }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }
}
