/// One request as a route sees it: a value, copied out of the connection, so that a route can be
/// run in a unit test without a socket and a deferred answer may keep it.
public struct HTTPRequest: Sendable {
    /// The method as sent, such as `GET`.
    public var method: String
    /// The path, percent-decoded by libmicrohttpd, without the query.
    public var path: String
    /// The request target exactly as sent (path and query, not percent-decoded), for requests
    /// under the server's `streamingPrefix`; nil for others.
    public var rawTarget: String?
    /// The query parameters in the order sent, percent-decoded; a parameter without `=` has no
    /// value. A decoded NUL (`%00`) stays in the value, so that `after=1%00` is refused rather
    /// than read as `after=1`.
    public var query: HTTPFields
    /// Every request header in the order sent, names as sent; a header without a value has the
    /// empty one.
    public var headers: HTTPFields
    /// The body, up to the server's cap.
    public var body: [UInt8]
    /// Whether the body was longer than the cap (and was cut).
    public var bodyTooLarge: Bool
    /// The body as it arrives, when `HTTPHandler.begin` chose to stream it.
    public var bodyStream: HTTPRequestBodyStream?
    /// The request line's HTTP/1 minor version, 0 to 9 (libmicrohttpd refuses any other version,
    /// and answers 1.2 to 1.9 as 1.1: RFC 9110 §2.5); known for requests under the server's
    /// `streamingPrefix` only (a gateway names the version it received in `Via`).
    public var minorVersion: UInt8 = 1
    /// What the handler's `begin` made of the head, left for its `handle` so that nothing is
    /// worked out twice (proxy mode: the checked target); nil when `begin` left nothing.
    public var admitted: (any Sendable)?

    public init(
        method: String, path: String, rawTarget: String? = nil, query: [(String, String?)] = [],
        headers: [(String, String)] = [], body: [UInt8] = [], bodyTooLarge: Bool = false,
        bodyStream: HTTPRequestBodyStream? = nil
    ) {
        self.init(
            method: method, path: path, rawTarget: rawTarget, query: HTTPFields(query),
            headers: HTTPFields(headers.map { ($0.0, $0.1) }), body: body, bodyTooLarge: bodyTooLarge,
            bodyStream: bodyStream)
    }

    init(
        method: String, path: String, rawTarget: String?, query: HTTPFields, headers: HTTPFields,
        body: [UInt8] = [], bodyTooLarge: Bool = false, bodyStream: HTTPRequestBodyStream? = nil
    ) {
        self.method = method
        self.path = path
        self.rawTarget = rawTarget
        self.query = query
        self.headers = headers
        self.body = body
        self.bodyTooLarge = bodyTooLarge
        self.bodyStream = bodyStream
    }

    /// The value of a request header, by name without regard to case; the first when repeated.
    public func header(_ name: String) -> String? { headers.firstIndex(named: name).flatMap(headers.value(at:)) }

    /// Calls `body` with the value of every request header named `name` (without regard to
    /// case), in the order sent: for a header whose value is a list, which a client may split
    /// across lines (RFC 9110 §5.3), the lines together are the list. Nothing is collected: each
    /// value is made as it is handed over.
    public func forEachHeader(named name: String, _ body: (String) -> Void) {
        headers.forEachIndex(named: name) { index in
            // A header always has a value, empty when none was sent.
            body(headers.value(at: index) ?? "")
        }
    }

    /// The value of a query parameter, as libmicrohttpd looks one up: the first parameter whose name
    /// matches without regard to ASCII case; nil when there is none, or when it has no `=`.
    public func query(_ name: String) -> String? {
        query.firstIndex(named: name).flatMap(query.value(at:))
    }

    /// How many parameters `query(_:)` could have found for `name`: names compared without regard
    /// to ASCII case, as the lookup does, and read up to a decoded NUL, as C reads them. So
    /// `after=1&after%00=2` and `audience=a&AUDIENCE=b` are each a repeated parameter, refused,
    /// rather than one value for the broker and another for a proxy in front that reads names exactly.
    public func queryCount(_ name: String) -> Int {
        query.count(namedUpToNUL: name)
    }
}
