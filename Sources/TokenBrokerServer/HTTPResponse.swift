internal import CMicroHTTPD
import Synchronization
import TokenBrokerCore

/// A complete HTTP answer, built once and queued as often as needed.
///
/// Owns one libmicrohttpd response; libmicrohttpd counts its own references, so the same
/// `HTTPResponse` may be queued on many connections at once, from any thread. The token
/// routes keep one per token version instead of building a body per request.
public final class HTTPResponse: @unchecked Sendable {
    // @unchecked: every stored property is immutable; the libmicrohttpd response behind `handle`
    // is reference-counted by libmicrohttpd and safe to queue from any thread.
    public let status: Int
    /// The body, for an answer built whole; empty for a streamed one.
    public let body: [UInt8]
    let handle: OpaquePointer
    /// The body's producer, for a streamed answer (which is sent once).
    let stream: HTTPResponseStream?
    /// The headers as given (before any is dropped as unsendable).
    private let fields: Fields

    /// Headers as the broker writes them, or as a proxied answer's came: values as bytes, which
    /// need not be UTF-8 (obs-text, RFC 9110 §5.5). Kept as given: neither is copied into the other.
    private enum Fields {
        case text([(String, String)])
        case bytes([(String, [UInt8])])
    }

    /// - Parameters:
    ///   - headers: names and values; a header whose name is not an RFC 9110 token or whose value
    ///     holds a control character other than tab is dropped rather than sent, and counted.
    public convenience init(status: Int, body: [UInt8], headers: [(String, String)] = []) {
        self.init(status: status, body: body, fields: .text(headers))
    }

    /// An answer whose header values are the bytes that came (a proxied answer's), sent as they
    /// are; dropped as `init(status:body:headers:)` says.
    public convenience init(status: Int, body: [UInt8], rawHeaders: [(String, [UInt8])]) {
        self.init(status: status, body: body, fields: .bytes(rawHeaders))
    }

    private init(status: Int, body: [UInt8], fields: Fields) {
        self.status = status
        self.fields = fields
        self.body = body
        handle = body.withUnsafeBytes { raw in
            CMicroHTTPD_response_copying(raw.count, raw.baseAddress)
        }
        stream = nil
        Self.add(fields, to: handle)
    }

    /// An answer without a body that stands for one of `length` bytes: a 304, whose
    /// `Content-Length` must be what a 200 to the same request would say (RFC 9110 §8.6), where
    /// an empty body would make libmicrohttpd say 0. libmicrohttpd sends the length and, for a
    /// 304, no body; the connection is kept.
    public convenience init(status: Int, headers: [(String, String)], standingFor length: Int) {
        self.init(status: status, fields: .text(headers), standingFor: UInt64(max(0, length)))
    }

    /// The same, with header values as the bytes that came (a proxied answer's).
    public convenience init(status: Int, rawHeaders: [(String, [UInt8])], standingFor length: UInt64) {
        self.init(status: status, fields: .bytes(rawHeaders), standingFor: length)
    }

    private init(status: Int, fields: Fields, standingFor length: UInt64) {
        self.status = status
        self.fields = fields
        body = []
        stream = nil
        handle = MHD_create_response_from_callback(length, 1, noBodyReader, nil, nil)
        Self.add(fields, to: handle)
    }

    /// A streamed answer: the body comes from `stream` as its producer writes it.
    /// - Parameter length: the body's length when known (sent as `Content-Length`); otherwise
    ///   HTTP/1.1 clients get it chunked.
    public convenience init(status: Int, headers: [(String, String)], stream: HTTPResponseStream, length: UInt64?) {
        self.init(status: status, fields: .text(headers), stream: stream, length: length)
    }

    /// A streamed answer whose header values are the bytes that came (a proxied answer's).
    /// - Parameters:
    ///   - length: the body's length when known; a 304's is that of the body it stands for,
    ///     which libmicrohttpd sends as `Content-Length`, sending no body.
    ///   - framedByClose: send it unchunked and close the connection after it, even without a
    ///     length: for an answer to HEAD of unknown length, which libmicrohttpd 0.9.75 would
    ///     otherwise follow with a last chunk (`0`) that the client reads as its next answer.
    public convenience init(
        status: Int, rawHeaders: [(String, [UInt8])], stream: HTTPResponseStream, length: UInt64?,
        framedByClose: Bool = false
    ) {
        self.init(status: status, fields: .bytes(rawHeaders), stream: stream, length: length)
        if framedByClose { _ = CMicroHTTPD_response_framed_by_close(handle) }
    }

    private init(status: Int, fields: Fields, stream: HTTPResponseStream, length: UInt64?) {
        self.status = status
        self.fields = fields
        body = []
        self.stream = stream
        let context = Unmanaged.passRetained(stream).toOpaque()
        handle = MHD_create_response_from_callback(
            length ?? UInt64.max, 32 * 1024, streamReader, context, streamReleaser)
        Self.add(fields, to: handle)
    }

    /// The headers as given, as text, for tests; a byte that is not UTF-8 reads as U+FFFD.
    public var headers: [(String, String)] {
        switch fields {
        case .text(let headers): headers
        case .bytes(let headers): headers.map { ($0.0, String(decoding: $0.1, as: UTF8.self)) }
        }
    }

    /// The headers as given, values as the bytes to send, for tests.
    public var rawHeaders: [(String, [UInt8])] {
        switch fields {
        case .text(let headers): headers.map { ($0.0, Array($0.1.utf8)) }
        case .bytes(let headers): headers
        }
    }

    /// Headers refused, here or by libmicrohttpd, since start; `/metrics` shows the count.
    public static var droppedHeaders: Int { droppedHeaderCount.load(ordering: .relaxed) }
    private static let droppedHeaderCount = Atomic<Int>(0)

    private static func add(_ fields: Fields, to handle: OpaquePointer) {
        switch fields {
        case .text(let headers):
            for (name, value) in headers {
                var value = value
                value.withUTF8 { add(name, $0, to: handle) }
            }
        case .bytes(let headers):
            for (name, value) in headers { value.withUnsafeBufferPointer { add(name, $0, to: handle) } }
        }
    }

    /// Adds one header, or drops and counts it.
    private static func add(_ name: String, _ value: UnsafeBufferPointer<UInt8>, to handle: OpaquePointer) {
        var name = name
        let sent = name.withUTF8 { name in
            guard !name.isEmpty, name.allSatisfy({ $0.isHTTPTokenCharacter }),
                value.allSatisfy(HTTPSyntax.isFieldValueByte)
            else { return false }
            // libmicrohttpd refuses an empty value: one space is sent instead, which is the same
            // empty value (RFC 9110 §5.5: a field value has no leading or trailing whitespace).
            let valueCount = max(value.count, 1)
            // Name and value as two C strings in one temporary buffer, not on the heap.
            return withUnsafeTemporaryAllocation(of: CChar.self, capacity: name.count + valueCount + 2) { line in
                guard let first = line.baseAddress else { return false }
                let start = UnsafeMutableRawPointer(first)
                if let bytes = name.baseAddress { start.copyMemory(from: bytes, byteCount: name.count) }
                line[name.count] = 0
                if let bytes = value.baseAddress, !value.isEmpty {
                    (start + name.count + 1).copyMemory(from: bytes, byteCount: value.count)
                } else {
                    line[name.count + 1] = CChar(UInt8(ascii: " "))
                }
                line[name.count + 1 + valueCount] = 0
                return MHD_add_response_header(handle, first, first + name.count + 1) == CMicroHTTPD_yes()
            }
        }
        if !sent { droppedHeaderCount.add(1, ordering: .relaxed) }
    }

    deinit { MHD_destroy_response(handle) }

    /// A JSON answer (`application/json`), with `Cache-Control: no-store` unless `headers` says otherwise.
    public convenience init(status: Int, json: String, headers: [(String, String)] = []) {
        var all: [(String, String)] = [("Content-Type", "application/json")]
        if !headers.contains(named: "Cache-Control") { all.append(("Cache-Control", "no-store")) }
        self.init(status: status, body: Array(json.utf8), headers: all + headers)
    }

    /// The body as text, for tests.
    public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

// libmicrohttpd's content reader for streamed answers: the context is the retained stream.
private let streamReader: MHD_ContentReaderCallback = { context, _, buffer, max in
    guard let context, let buffer else { return -2 }
    let stream = Unmanaged<HTTPResponseStream>.fromOpaque(context).takeUnretainedValue()
    return stream.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: max))
}

// The content reader of an answer that stands for a body it never sends: never called for a
// 304 (libmicrohttpd counts the body as sent), and an error if it ever were.
private let noBodyReader: MHD_ContentReaderCallback = { _, _, _, _ in -2 }

private let streamReleaser: MHD_ContentReaderFreeCallback = { context in
    guard let context else { return }
    Unmanaged<HTTPResponseStream>.fromOpaque(context).release()
}
