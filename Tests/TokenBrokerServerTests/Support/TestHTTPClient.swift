import Glibc

/// A plain HTTP/1.1 client on a blocking loopback socket, written apart from the server it tests.
///
/// Every receive waits at most `timeoutSeconds` (`SO_RCVTIMEO`), and every loop is bounded in
/// reads and bytes, so a server that never answers fails the test instead of hanging it.
final class TestHTTPClient {
    /// Something the test did not expect from the socket.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// A connection that could not be made, with `connect`'s errno.
    struct ConnectFailure: Error, CustomStringConvertible {
        let code: Int32
        let port: UInt16
        var description: String { "connect to 127.0.0.1:\(port) failed: errno \(code)" }
    }

    /// One response as read off the wire.
    struct Response {
        let status: Int
        /// Every header in the order received.
        let headers: [(String, String)]
        let body: [UInt8]
        /// The head's bytes as received, without the blank line that ends it.
        var head: [UInt8] = []

        /// The first header of that name, without regard to case.
        func header(_ name: String) -> String? {
            headers.first { $0.0.lowercased() == name.lowercased() }?.1
        }

        var text: String { String(decoding: body, as: UTF8.self) }
    }

    private var fd: Int32
    private var received: [UInt8] = []
    private static let mostReads = 10_000
    private static let mostBytes = 4 * 1024 * 1024

    /// Connects to 127.0.0.1 on `port`.
    init(port: UInt16, timeoutSeconds: Int = 10) throws {
        fd = try Self.connected(port: port, timeoutSeconds: timeoutSeconds)
    }

    deinit { close() }

    /// Whether a new connection to 127.0.0.1 on `port` is accepted now.
    /// Whether the kernel refuses a connection to the port (`ECONNREFUSED`): nothing listens
    /// there. A full backlog or a timeout is not a refusal.
    static func isRefused(port: UInt16) -> Bool {
        do {
            Glibc.close(try connected(port: port, timeoutSeconds: 1))
            return false
        } catch let failure as ConnectFailure {
            return failure.code == ECONNREFUSED
        } catch {
            return false
        }
    }

    private static func connected(port: UInt16, timeoutSeconds: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket failed: errno \(errno)") }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            Glibc.close(fd)
            throw ConnectFailure(code: code, port: port)
        }
        return fd
    }

    /// Closes the connection (a client hanging up).
    func close() {
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
    }

    /// Closes the sending side only (`shutdown(SHUT_WR)`), as `nc -N` does: the client still reads.
    func closeSending() { _ = Glibc.shutdown(fd, Int32(SHUT_WR)) }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) throws {
        var sent = 0
        // Each round sends at least one byte or fails, so the loop ends.
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw Failure(description: "send failed: errno \(errno)") }
            sent += n
        }
    }

    /// Reads one response: its head, then a body framed by `Content-Length`, chunked, or ended
    /// by the server closing the connection.
    func readResponse() throws -> Response {
        let head = try readHead()
        let body: [UInt8]
        if let length = head.header("Content-Length") {
            guard let count = Int(length), count >= 0, count <= Self.mostBytes else {
                throw Failure(description: "bad Content-Length: \(length)")
            }
            body = try take(count)
        } else if head.header("Transfer-Encoding")?.lowercased() == "chunked" {
            body = try readChunks()
        } else {
            body = try readUntilClosed()
        }
        return Response(status: head.status, headers: head.headers, body: body, head: head.head)
    }

    /// Reads one response's head only (its body empty here), leaving the body to be read.
    func readHead() throws -> Response {
        let headEnd = try fill { Self.find([13, 10, 13, 10], in: $0) }
        let bytes = Array(received[..<headEnd])
        let head = String(decoding: bytes, as: UTF8.self)
        received.removeFirst(headEnd + 4)
        let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        let statusParts = lines[0].split(separator: " ", maxSplits: 2)
        guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/1."), let status = Int(statusParts[1]) else {
            throw Failure(description: "not a status line: \(lines[0])")
        }
        var headers: [(String, String)] = []
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { throw Failure(description: "not a header line: \(line)") }
            let value = line[line.index(after: colon)...].drop { $0 == " " || $0 == "\t" }
            headers.append((String(line[..<colon]), String(value)))
        }
        return Response(status: status, headers: headers, body: [], head: bytes)
    }

    /// Whether the server closed the connection: the next receive finds its end (or a reset)
    /// before any byte. Waits at most the receive timeout.
    func isClosedByServer() -> Bool {
        guard received.isEmpty else { return false }
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, 0)
        return n == 0 || (n < 0 && errno == ECONNRESET)
    }

    // MARK: - Reading

    /// Receives until `found` gives an index in what was received; returns it.
    private func fill(_ found: ([UInt8]) -> Int?) throws -> Int {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        for _ in 0..<Self.mostReads {
            if let index = found(received) { return index }
            guard received.count <= Self.mostBytes else {
                throw Failure(description: "more than \(Self.mostBytes) bytes")
            }
            let n = recv(fd, &chunk, chunk.count, 0)
            if n == 0 { throw Failure(description: "the server closed the connection after \(received.count) bytes") }
            if n < 0 { throw Failure(description: "receive failed (errno \(errno), a timeout is EAGAIN \(EAGAIN))") }
            received.append(contentsOf: chunk[..<n])
        }
        throw Failure(description: "no answer after \(Self.mostReads) reads")
    }

    private func take(_ count: Int) throws -> [UInt8] {
        _ = try fill { $0.count >= count ? count : nil }
        defer { received.removeFirst(count) }
        return Array(received[..<count])
    }

    private func readChunks() throws -> [UInt8] {
        var body: [UInt8] = []
        for _ in 0..<Self.mostReads {
            let lineEnd = try fill { Self.find([13, 10], in: $0) }
            let sizeText = String(decoding: received[..<lineEnd], as: UTF8.self).split(separator: ";")[0]
            guard let size = Int(sizeText.filter { $0 != " " }, radix: 16), size >= 0, size <= Self.mostBytes else {
                throw Failure(description: "bad chunk size: \(sizeText)")
            }
            received.removeFirst(lineEnd + 2)
            if size == 0 {
                // No trailers are expected: the empty line ends the body.
                _ = try take(2)
                return body
            }
            body += try take(size)
            _ = try take(2)
        }
        throw Failure(description: "more than \(Self.mostReads) chunks")
    }

    private func readUntilClosed() throws -> [UInt8] {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        for _ in 0..<Self.mostReads {
            let n = recv(fd, &chunk, chunk.count, 0)
            if n == 0 { break }
            if n < 0 { throw Failure(description: "receive failed: errno \(errno)") }
            received.append(contentsOf: chunk[..<n])
            guard received.count <= Self.mostBytes else {
                throw Failure(description: "more than \(Self.mostBytes) bytes")
            }
        }
        defer { received = [] }
        return received
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        return (0...haystack.count - needle.count).first { start in
            needle.indices.allSatisfy { haystack[start + $0] == needle[$0] }
        }
    }
}
