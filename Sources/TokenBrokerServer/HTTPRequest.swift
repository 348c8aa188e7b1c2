internal import CMicroHTTPD
import Glibc

/// One request as the handler sees it.
///
/// - Important: valid only during `HTTPHandler.handle`; it reads from the libmicrohttpd
///   connection, which may be gone afterwards. Copy what a deferred answer needs.
public struct HTTPRequest {
    /// The method as sent, such as `GET`.
    public let method: String
    /// The path, percent-decoded by libmicrohttpd, without the query.
    public let path: String
    /// The body, up to the server's cap.
    public let body: [UInt8]
    /// Whether the body was longer than the cap (and was cut).
    public let bodyTooLarge: Bool
    /// The request target exactly as sent (path and query, not percent-decoded), for requests
    /// under the server's `streamingPrefix`; nil for others.
    public let rawTarget: String?
    /// The body as it arrives, when `HTTPHandler.begin` chose to stream it.
    public let bodyStream: HTTPRequestBodyStream?
    let connection: OpaquePointer

    init(method: String, path: String, body: [UInt8], bodyTooLarge: Bool, rawTarget: String? = nil,
         bodyStream: HTTPRequestBodyStream? = nil, connection: OpaquePointer) {
        self.method = method
        self.path = path
        self.body = body
        self.bodyTooLarge = bodyTooLarge
        self.rawTarget = rawTarget
        self.bodyStream = bodyStream
        self.connection = connection
    }

    /// Every request header in the order sent, names as sent.
    public func headers() -> [(String, String)] {
        var collected: [(String, String)] = []
        withUnsafeMutablePointer(to: &collected) { pointer in
            _ = MHD_get_connection_values(connection, .HEADER_KIND, { cls, _, key, value in
                guard let cls, let key else { return CMicroHTTPD_yes() }
                let list = cls.assumingMemoryBound(to: [(String, String)].self)
                list.pointee.append((String(cString: key), value.map { String(cString: $0) } ?? ""))
                return CMicroHTTPD_yes()
            }, pointer)
        }
        return collected
    }

    /// The value of a request header, by case-insensitive name; the first when repeated.
    public func header(_ name: String) -> String? {
        MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
    }

    /// The value of a query parameter, percent-decoded; the first when repeated. A decoded NUL
    /// (`%00`) stays in the value, so that `after=1%00` is refused rather than read as `after=1`.
    public func query(_ name: String) -> String? {
        var value: UnsafePointer<CChar>?
        var length = 0
        let found = name.withCString { key in
            MHD_lookup_connection_value_n(connection, .GET_ARGUMENT_KIND, key, strlen(key), &value, &length)
        }
        guard found == CMicroHTTPD_yes(), let value else { return nil }
        return value.withMemoryRebound(to: UInt8.self, capacity: length) {
            String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
        }
    }

    /// How many times a query parameter appears, so that a repeated one can be refused.
    public func queryCount(_ name: String) -> Int {
        var context = (0, UnsafePointer<CChar>(bitPattern: 1)!)
        return name.withCString { cName in
            context.1 = cName
            _ = withUnsafeMutablePointer(to: &context) { pointer in
                MHD_get_connection_values(connection, .GET_ARGUMENT_KIND, { cls, _, key, _ in
                    guard let cls, let key else { return CMicroHTTPD_yes() }
                    let context = cls.assumingMemoryBound(to: (Int, UnsafePointer<CChar>).self)
                    if strcmp(key, context.pointee.1) == 0 { context.pointee.0 += 1 }
                    return CMicroHTTPD_yes()
                }, pointer)
            }
            return context.0
        }
    }
}
