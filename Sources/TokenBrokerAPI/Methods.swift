// The methods each route allows, and the 405 for the others.
import TokenBrokerServer

/// The methods routes allow, and the check that answers 405 (`ErrorAnswer.methodNotAllowed`) to others.
enum Methods {
    /// Routes that only read: `GET` and `HEAD`.
    static let read = ["GET", "HEAD"]
    /// `POST /token/refresh`.
    static let post = ["POST"]

    /// Nil when the method is allowed, else the 405 answer with `Allow`.
    static func only(_ methods: [String], _ request: HTTPRequest) -> HTTPReply? {
        guard !methods.contains(request.method) else { return nil }
        return .response(ErrorAnswer.methodNotAllowed(method: request.method, allow: methods).response)
    }
}
