/// What a listener does with each request.
public protocol HTTPHandler: Sendable {
    /// Answers at once, or defers: the server suspends the connection (no thread waits) and
    /// resumes it when the `HTTPResponder` is given an answer.
    ///
    /// - Important: runs on a libmicrohttpd thread. Never block it: take a lock briefly, never
    ///   wait for I/O. Slow work goes through `.deferred`.
    func handle(_ request: HTTPRequest) -> HTTPReply

    /// For requests under the server's `streamingPrefix` only: called when their headers have
    /// arrived, before any body, to say what to do with the body.
    func begin(_ request: HTTPRequest) -> BodyHandling
}

extension HTTPHandler {
    public func begin(_ request: HTTPRequest) -> BodyHandling { .buffer(limit: nil) }
}

/// What to do with a request's body, decided when its headers arrive.
public enum BodyHandling {
    /// Read it whole (up to `limit` bytes, or the server's cap), then call `handle`.
    case buffer(limit: Int?)
    /// Call `handle` now; the body flows to the request's `bodyStream` as it arrives.
    case stream(HTTPRequestBodyStream)
    /// Answer now, without reading the body (the connection then closes).
    case refuse(HTTPResponse)
}

/// A handler's answer.
public enum HTTPReply {
    /// Queue this response now.
    case response(HTTPResponse)
    /// Suspend the connection and call `start` with a responder that will resume it.
    case deferred(_ start: @Sendable (HTTPResponder) -> Void)
}
