internal import CMicroHTTPD
import Glibc

/// An answer written straight to a connection's socket, past libmicrohttpd, where it could not
/// send one: the request's head took the memory the answer's head needs (`AnswerRoom`), or
/// libmicrohttpd is stuck on the request line (`HTTPServer.unescaping`).
///
/// Its head is the one libmicrohttpd writes for an answer on a connection it then closes: the
/// status line, `Date`, `Connection: close`, `Content-Length`, then the answer's own headers (but
/// those four, and any the server would not send: `HTTPResponse`).
///
/// - Important: only where libmicrohttpd has sent nothing of the request's answer and will send
///   nothing after it: the caller then has the connection closed (the access handler returns
///   `MHD_NO`, or the socket is shut down). Every answer before it on the connection has gone
///   to the kernel whole, since libmicrohttpd reads a request line only once the previous answer
///   is out, and none of this one has.
struct DirectAnswer {
    /// The status line and headers, with the empty line that ends them.
    let head: [UInt8]
    let body: [UInt8]

    /// - Parameters:
    ///   - withBody: false for an answer to HEAD, which says the body's length and sends none.
    ///   - now: the time for `Date`.
    init(_ response: HTTPResponse, withBody: Bool, now: time_t = time(nil)) {
        var head = Array("HTTP/1.1 \(response.status) ".utf8)
        head += Self.reasonPhrase(response.status)
        head += Array("\r\nDate: \(Self.imfFixdate(now))\r\nConnection: close\r\n".utf8)
        head += Array("Content-Length: \(response.body.count)\r\n".utf8)
        for (name, value) in response.rawHeaders where Self.passes(name, value) {
            head += Array(name.utf8) + [UInt8(ascii: ":"), UInt8(ascii: " ")] + value
            head += [UInt8(ascii: "\r"), UInt8(ascii: "\n")]
        }
        head += [UInt8(ascii: "\r"), UInt8(ascii: "\n")]
        self.head = head
        body = withBody ? response.body : []
    }

    /// Writes it to `fd` without waiting, as much as the socket takes: all of it, but to a client
    /// that has left earlier answers unread.
    func send(to fd: Int32) {
        let bytes = head + body
        var sent = 0
        // Each round sends at least one byte or ends the loop.
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
            }
            guard count > 0 else { return }
            sent += count
        }
    }

    /// libmicrohttpd's reason phrase for `status` (its own table, so that both heads are alike).
    private static func reasonPhrase(_ status: Int) -> [UInt8] {
        guard let phrase = MHD_get_reason_phrase_for(UInt32(clamping: status)), phrase.pointee != 0 else {
            return Array("Non-Standard Status".utf8)
        }
        return Array(UnsafeRawBufferPointer(start: phrase, count: strlen(phrase)))
    }

    /// Whether a header of the answer is sent: not one of those the head writes itself, and one
    /// libmicrohttpd would send (`HTTPResponse` drops the others).
    private static func passes(_ name: String, _ value: [UInt8]) -> Bool {
        let lower = name.lowercased()
        guard !["connection", "content-length", "date", "transfer-encoding"].contains(lower) else { return false }
        return !name.isEmpty && name.utf8.allSatisfy(\.isHTTPTokenCharacter)
            && value.allSatisfy(HTTPSyntax.isFieldValueByte)
    }

    /// `time` as an HTTP date (RFC 9110 §5.6.7): `Sun, 06 Nov 1994 08:49:37 GMT`.
    static func imfFixdate(_ time: time_t) -> String {
        var seconds = time
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ number: Int32) -> String { number < 10 ? "0\(number)" : "\(number)" }
        return
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(1900 + parts.tm_year) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
