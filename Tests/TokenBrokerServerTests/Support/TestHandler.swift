import TokenBrokerCore
import TokenBrokerServer

/// A handler for server tests: its answers come from closures, and it keeps every request,
/// request head (`begin`) and refusal it saw, and the responders of deferred requests.
final class TestHandler: HTTPHandler {
    let handled = Lock<[HTTPRequest]>([])
    let begun = Lock<[HTTPRequest]>([])
    let refusals = Lock<[ServerRefusal]>([])
    let responders: Lock<[any HTTPResponding]>
    private let answer: @Sendable (HTTPRequest) -> HTTPReply
    private let bodyHandling: @Sendable (HTTPRequest) -> BodyHandling

    /// - Parameters:
    ///   - responders: where `defer` keeps the responders of deferred requests.
    ///   - answer: the answer to each request; by default 200 with the body `ok`.
    ///   - begin: what to do with the body of a request under the streaming prefix.
    init(
        responders: Lock<[any HTTPResponding]> = Lock([]),
        answer: @escaping @Sendable (HTTPRequest) -> HTTPReply = { _ in .response(TestHandler.text(200, "ok")) },
        begin: @escaping @Sendable (HTTPRequest) -> BodyHandling = { _ in .buffer(limit: nil) }
    ) {
        self.responders = responders
        bodyHandling = begin
        self.answer = answer
    }

    /// A handler that defers the requests whose path is `deferredPath` (every request when nil),
    /// keeping their responders in `responders`, and answers the others 200 `ok`.
    static func deferring(_ deferredPath: String? = nil) -> TestHandler {
        let responders = Lock<[any HTTPResponding]>([])
        return TestHandler(responders: responders) { request in
            guard deferredPath == nil || request.path == deferredPath else { return .response(text(200, "ok")) }
            return .deferred { responder in responders.withLock { $0.append(responder) } }
        }
    }

    /// The responders of deferred requests so far.
    var deferred: [any HTTPResponding] { responders.withLock { $0 } }

    func handle(_ request: HTTPRequest) -> HTTPReply {
        handled.withLock { $0.append(request) }
        return answer(request)
    }

    func begin(_ request: inout HTTPRequest) -> BodyHandling {
        begun.withLock { $0.append(request) }
        return bodyHandling(request)
    }

    /// Answers a test can tell apart from any route's: 400 `malformed: <problem>`, 503 `stopping`,
    /// 503 `stopped`, 413 `too large`, 414 `too many arguments`, 431 `head too large`, 503 `too many
    /// waiting: <places> at <path>` and 503 `client closed`
    /// (asked for once, when the server starts, and not recorded).
    func refusal(_ reason: ServerRefusal) -> HTTPResponse {
        if reason == .clientClosed { return Self.text(503, "client closed") }
        refusals.withLock { $0.append(reason) }
        switch reason {
        case .clientClosed:
            return Self.text(503, "client closed")
        case .malformedHead(let problem):
            return Self.text(400, "malformed: \(problem)", headers: [("Connection", "close")])
        case .stopping:
            return Self.text(503, "stopping", headers: [("Connection", "close")])
        case .stopped:
            return Self.text(503, "stopped")
        case .bodyTooLarge:
            return Self.text(413, "too large")
        case .tooManyQueryArguments:
            return Self.text(414, "too many arguments", headers: [("Connection", "close")])
        case .headTooLarge:
            return Self.text(431, "head too large", headers: [("Connection", "close")])
        case .tooManyWaiting(let path, let places):
            return Self.text(503, "too many waiting: \(places) at \(path)")
        }
    }

    static func text(_ status: Int, _ body: String, headers: [(String, String)] = []) -> HTTPResponse {
        HTTPResponse(status: status, body: Array(body.utf8), headers: [("Content-Type", "text/plain")] + headers)
    }
}
