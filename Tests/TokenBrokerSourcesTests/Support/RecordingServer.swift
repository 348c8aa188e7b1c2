import Foundation
import Glibc
import Synchronization

/// A loopback token endpoint for one request: records the request's head and its body (as long as
/// its `Content-Length` says), answers `200` with `answer` as a JSON body, and closes.
final class RecordingServer: Sendable {
    /// What the server received, split at the blank line.
    struct Received: Sendable {
        /// The request line and headers, as text.
        let head: String
        let body: [UInt8]

        /// The request line, such as `POST /token HTTP/1.1`.
        var requestLine: String { String(head.split(separator: "\r\n", omittingEmptySubsequences: false)[0]) }

        /// The value of the first header called `name`, whatever its case, without surrounding space.
        func header(_ name: String) -> String? {
            for line in head.split(separator: "\r\n").dropFirst() {
                let parts = line.split(separator: ":", maxSplits: 1)
                if parts.count == 2, parts[0].lowercased() == name.lowercased() {
                    return parts[1].trimmingCharacters(in: .whitespaces)
                }
            }
            return nil
        }

        var bodyText: String { String(decoding: body, as: UTF8.self) }
    }

    let port: UInt16
    private let received = Mutex<Received?>(nil)

    /// Starts listening on 127.0.0.1; `answer` is the JSON body of the `200` it sends.
    init(answer: String = #"{"access_token":"recorded-token","expires_in":300}"#) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw POSIXError(.EADDRNOTAVAIL)
        }
        port = UInt16(bigEndian: address.sin_port)
        let response =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(answer.utf8.count)\r\n"
            + "Connection: close\r\n\r\n" + answer
        Thread.detachNewThread { [self] in serve(fd, response: response) }
    }

    /// `http://127.0.0.1:port` followed by `path`.
    func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    private func serve(_ listener: Int32, response: String) {
        let connection = accept(listener, nil, nil)
        defer {
            close(connection)
            close(listener)
        }
        guard connection >= 0 else { return }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        let separator = Array("\r\n\r\n".utf8)
        while true {
            if let end = Self.range(of: separator, in: bytes) {
                let head = String(decoding: bytes[..<end.lowerBound], as: UTF8.self)
                let length = Received(head: head, body: []).header("Content-Length").flatMap { Int($0) } ?? 0
                if bytes.count - end.upperBound >= length {
                    received.withLock {
                        $0 = Received(head: head, body: Array(bytes[end.upperBound..<(end.upperBound + length)]))
                    }
                    break
                }
            }
            let count = recv(connection, &chunk, chunk.count, 0)
            if count <= 0 { return }
            bytes += chunk[0..<count]
        }
        _ = response.withCString { send(connection, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
    }

    private static func range(of needle: [UInt8], in bytes: [UInt8]) -> Range<Int>? {
        guard bytes.count >= needle.count else { return nil }
        for start in 0...(bytes.count - needle.count) where bytes[start..<(start + needle.count)].elementsEqual(needle)
        {
            return start..<(start + needle.count)
        }
        return nil
    }

    /// The request, once it came (nil after `timeout`: a generous bound, not a timing assertion).
    func request(timeout: Duration = .seconds(20)) async -> Received? {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if let request = received.withLock({ $0 }) { return request }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }
}
