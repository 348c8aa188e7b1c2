/// What a listener does with each request.
public protocol HTTPHandler: Sendable {
    /// Answers at once, or defers: the server suspends the connection (no thread waits) and
    /// resumes it when the `HTTPResponder` is given an answer.
    ///
    /// - Important: runs on a libmicrohttpd thread. Never block it: take a lock briefly, never
    ///   wait for I/O. Slow work goes through `.deferred`.
    func handle(_ request: HTTPRequest) -> HTTPReply
}

/// A handler's answer.
public enum HTTPReply {
    /// Queue this response now.
    case response(HTTPResponse)
    /// Suspend the connection and call `start` with a responder that will resume it.
    case deferred(_ start: @Sendable (HTTPResponder) -> Void)
}
