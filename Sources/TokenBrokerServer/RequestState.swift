/// What a request carries between calls of the access handler, when it needs more than its
/// phase: a body being buffered or streamed, a deferred answer, or the target as sent.
///
/// Only libmicrohttpd's thread serving the request's connection touches it, one call at a time.
final class RequestState {
    var body: [UInt8] = []
    var tooLarge = false
    var responder: HTTPResponder?
    /// For requests under the streaming prefix: the target as sent.
    var rawTarget: String?
    /// For requests under the streaming prefix whose body is read whole: the request as the
    /// handler's `begin` left it, which `handle` gets with the body.
    var head: HTTPRequest?
    var bodyLimit: Int?
    var bodyStream: HTTPRequestBodyStream?

    /// The request's state, created on first need; the request context then holds one reference
    /// to it (given back in `HTTPServer.completed`).
    static func attach(to requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>) -> RequestState {
        switch RequestPhase(requestContext.pointee) {
        case .targetRead(let state), .underway(let state):
            return state
        case .awaitingHead, .headRead:
            let state = RequestState()
            requestContext.pointee = RequestPhase.underway(state).retainingContext
            return state
        }
    }

    func append(_ data: UnsafePointer<CChar>?, count: Int, limit: Int) {
        guard let data, !tooLarge else { return }
        guard body.count + count <= limit else {
            tooLarge = true
            body = []
            return
        }
        data.withMemoryRebound(to: UInt8.self, capacity: count) {
            body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
        }
    }
}
