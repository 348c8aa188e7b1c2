// Requests as the server would hand them over, and ways to read the routes' answers.
import Testing
import TokenBrokerCore
import TokenBrokerServer

/// A `GET` that passes the request guard unless `guarded` is false.
func request(
    _ path: String, query: [(String, String)] = [], headers: [(String, String)] = [], rawTarget: String? = nil,
    guarded: Bool = true
) -> HTTPRequest {
    request("GET", path, query: query, headers: headers, rawTarget: rawTarget, guarded: guarded)
}

/// A request that passes the request guard unless `guarded` is false.
func request(
    _ method: String, _ path: String, query: [(String, String)] = [], headers: [(String, String)] = [],
    body: String = "", bodyTooLarge: Bool = false, rawTarget: String? = nil, guarded: Bool = true
) -> HTTPRequest {
    HTTPRequest(
        method: method, path: path, rawTarget: rawTarget, query: query,
        headers: (guarded ? [("Token-Broker-Request", "true")] : []) + headers, body: Array(body.utf8),
        bodyTooLarge: bodyTooLarge)
}

extension HTTPReply {
    /// The answer given at once, or nil for a deferred one.
    var immediate: HTTPResponse? {
        if case .response(let response) = self { return response }
        return nil
    }

    /// Starts a deferred answer with `responder`; false when the answer was immediate.
    @discardableResult
    func start(_ responder: RecordingResponder) -> Bool {
        guard case .deferred(let start) = self else { return false }
        start(responder)
        return true
    }
}

extension HTTPResponse {
    /// The JSON body's members; empty when the body is not a JSON object.
    var members: [String: JSONValue] {
        guard case .object(let members)? = try? JSONValue(parsing: body) else { return [:] }
        return members
    }

    /// A string member of the JSON body.
    func string(_ name: String) -> String? {
        guard case .string(let value)? = members[name] else { return nil }
        return value
    }

    /// A boolean member of the JSON body.
    func bool(_ name: String) -> Bool? {
        guard case .bool(let value)? = members[name] else { return nil }
        return value
    }

    /// A number member of the JSON body, when whole.
    func int(_ name: String) -> Int? { members[name]?.exactInt }

    /// A header's value, by name without regard to case.
    func header(_ name: String) -> String? { headers.value(named: name) }

    /// The `error` member of an error answer.
    var errorCode: String? { string("error") }
}

/// Checks an error answer: its status, `error` code, and that it carries exactly these of the
/// headers that matter (`Allow`, `Retry-After`, `WWW-Authenticate`, `Connection`).
func expectError(
    _ response: HTTPResponse?, _ status: Int, _ code: String, headers expected: [String: String] = [:],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    guard let response else {
        Issue.record("no immediate answer", sourceLocation: sourceLocation)
        return
    }
    #expect(response.status == status, sourceLocation: sourceLocation)
    #expect(response.errorCode == code, sourceLocation: sourceLocation)
    #expect(response.header("Content-Type") == "application/json", sourceLocation: sourceLocation)
    #expect(response.string("error_description")?.isEmpty == false, sourceLocation: sourceLocation)
    for name in ["Allow", "Retry-After", "WWW-Authenticate", "Connection"] {
        #expect(response.header(name) == expected[name], "\(name)", sourceLocation: sourceLocation)
    }
}
