import Foundation
import Glibc
import Synchronization

/// A loopback server for one connection: reads the request's head (with `wholeRequest`, all
/// that comes until the peer stops sending for a second or closes), then sends `answer` and
/// closes, or, with no answer, stays silent until the peer closes (at most 30 s).
final class CannedServer: Sendable {
    let port: UInt16
    private let listener: Int32
    private let state = Mutex<(head: [UInt8]?, peerClosed: Bool)>((nil, false))

    init(answer: String?, wholeRequest: Bool = false) throws {
        (listener, port) = try Self.listen()
        let listener = listener
        Thread.detachNewThread { [self] in serve(listener, answer: answer, wholeRequest: wholeRequest) }
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

    private func serve(_ listener: Int32, answer: String?, wholeRequest: Bool) {
        let connection = accept(listener, nil, nil)
        defer {
            close(connection)
            close(listener)
        }
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<100 where wholeRequest || !received.ends(with: "\r\n\r\n") {
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

    /// The request's head (or all of it, with `wholeRequest`), once it came.
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
