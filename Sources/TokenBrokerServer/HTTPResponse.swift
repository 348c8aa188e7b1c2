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
    /// The headers as given (before any is dropped as unsendable), for tests.
    public let headers: [(String, String)]
    /// The body, for an answer built whole; empty for a streamed one.
    public let body: [UInt8]
    let handle: OpaquePointer
    /// The body's producer, for a streamed answer (which is sent once).
    let stream: HTTPResponseStream?

    /// - Parameters:
    ///   - headers: names and values; a header whose name is not an RFC 9110 token or whose value
    ///     holds a control character other than tab is dropped rather than sent, and counted.
    public init(status: Int, body: [UInt8], headers: [(String, String)] = []) {
        self.status = status
        self.headers = headers
        self.body = body
        handle = body.withUnsafeBytes { raw in
            CMicroHTTPD_response_copying(raw.count, raw.baseAddress)
        }
        stream = nil
        Self.add(headers, to: handle)
    }

    /// A streamed answer: the body comes from `stream` as its producer writes it.
    /// - Parameter length: the body's length when known (sent as `Content-Length`); otherwise
    ///   HTTP/1.1 clients get it chunked.
    public init(status: Int, headers: [(String, String)], stream: HTTPResponseStream, length: UInt64?) {
        self.status = status
        self.headers = headers
        body = []
        self.stream = stream
        let context = Unmanaged.passRetained(stream).toOpaque()
        handle = MHD_create_response_from_callback(
            length ?? UInt64.max, 32 * 1024, streamReader, context, streamReleaser)
        Self.add(headers, to: handle)
    }

    /// Headers refused, here or by libmicrohttpd, since start; `/metrics` shows the count.
    public static var droppedHeaders: Int { droppedHeaderCount.load(ordering: .relaxed) }
    private static let droppedHeaderCount = Atomic<Int>(0)

    private static func add(_ headers: [(String, String)], to handle: OpaquePointer) {
        for (name, value) in headers {
            var name = name
            var value = value
            let sendable = name.withUTF8 { name in
                !name.isEmpty && name.allSatisfy(HTTPSyntax.isTokenCharacter)
                    && value.withUTF8 { $0.allSatisfy(HTTPSyntax.isFieldValueByte) }
            }
            // Through `withCString`: passed straight as an argument, a short string (15 bytes or
            // fewer, as most header names are) is first copied to a new array on the heap.
            if !sendable
                || name.withCString({ name in value.withCString { MHD_add_response_header(handle, name, $0) } })
                    != CMicroHTTPD_yes()
            {
                droppedHeaderCount.add(1, ordering: .relaxed)
            }
        }
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

private let streamReleaser: MHD_ContentReaderFreeCallback = { context in
    guard let context else { return }
    Unmanaged<HTTPResponseStream>.fromOpaque(context).release()
}
