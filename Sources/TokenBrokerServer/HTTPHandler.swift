/// What a listener does with each request.
public protocol HTTPHandler: Sendable {
    /// Answers at once, or defers: the server suspends the connection (no thread waits) and
    /// resumes it when the `HTTPResponder` is given an answer.
    ///
    /// - Important: runs on a libmicrohttpd thread. Never block it: take a lock briefly, never
    ///   wait for I/O. Slow work goes through `.deferred`.
    func handle(_ request: HTTPRequest) -> HTTPReply

    /// For requests under the server's `streamingPrefix` only: called when their headers have
    /// arrived, before any body, to say what to do with the body. `handle` later gets the
    /// request as `begin` left it (with `admitted` set, if it set it), and the body.
    func begin(_ request: inout HTTPRequest) -> BodyHandling

    /// The answer to a request the server itself refuses: the server knows no error text, so
    /// the handler words every answer. Called on a libmicrohttpd thread; keep it quick.
    func refusal(_ reason: ServerRefusal) -> HTTPResponse
}

/// Why the server answers a request without its handler's routes.
public enum ServerRefusal: Sendable, Equatable {
    /// The request head is ambiguous or malformed (`RequestHead`); the answer must close the
    /// connection (`Connection: close`), since where the body ends is not known.
    case malformedHead(String)
    /// The target has more query arguments than the connection's memory holds beside it
    /// (`RequestTarget.mostQueryArguments`): 414, answered at the head, so the connection closes.
    case tooManyQueryArguments
    /// The request's head leaves less of the connection's memory than an answer's head needs
    /// (`AnswerRoom`): 431, answered at the head, so the connection closes.
    case headTooLarge
    /// A new request arrived while the server is stopping; the answer must close the connection.
    case stopping
    /// The answer to requests still waiting when the server stops.
    case stopped
    /// The request's body is larger than the server takes (`maximumBodyBytes`): answered 413
    /// once the body has been read (and dropped), or at once instead of `100 Continue` when the
    /// client waits for it (its `Content-Length` says so), and then the connection closes.
    case bodyTooLarge
    /// The client closed its side while its request waited suspended: the answer resumes the
    /// connection, and a client that only half-closed (`shutdown(SHUT_WR)`) still reads it.
    case clientClosed
    /// The handler deferred its answer, and every place the listener keeps for waiting requests
    /// (`places`, seven eighths of its connection limit) is taken: answered at once instead, and
    /// the deferred answer's `start` never runs (what `handle` did before it returned stands).
    /// `path` is the request's, for a handler that words its answers differently by route.
    case tooManyWaiting(path: String, places: Int)
}

extension HTTPHandler {
    public func begin(_ request: inout HTTPRequest) -> BodyHandling { .buffer(limit: nil) }
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
    /// Suspend the connection and call `start` with a responder that will resume it; the request
    /// holds one of the listener's places for waiting requests until it is answered (or, when
    /// none is free, is refused with `ServerRefusal.tooManyWaiting`, and `start` is not called).
    case deferred(_ start: @Sendable (any HTTPResponding) -> Void)
}

/// The way back to a deferred request (`HTTPResponder` on a live connection; a recorder in tests).
public protocol HTTPResponding: AnyObject, Sendable {
    /// Answers the request and resumes its connection; a second answer, or one after the client
    /// hung up, does nothing.
    func respond(_ response: HTTPResponse)
    /// Registers a cleanup to run once if the connection ends before an answer.
    func onClose(_ cleanup: @escaping @Sendable () -> Void)
    /// Registers work to run once when the connection ends, answered or not.
    func whenConnectionEnds(_ work: @escaping @Sendable () -> Void)
    /// Registers work to run once when the request stops waiting: it is answered, its client
    /// hangs up, or its connection ends first; at once when that has already happened. Runs
    /// before the connection resumes, so that what it frees is free when the answer arrives.
    func whenWaitEnds(_ work: @escaping @Sendable () -> Void)
}
