// Running a test's templates while it asks them, and reading the answers their children defer.
import TokenBrokerServer
import TokenBrokerTestSupport

/// Runs the templates for the length of `body`, then stops them.
func running<T>(_ templates: [LiveTemplate], _ body: () async throws -> T) async rethrows -> T {
    let tasks = templates.map { template in Task { await template.run() } }
    defer { for task in tasks { task.cancel() } }
    return try await body()
}

/// Waits (at most 10 s) for a deferred answer; an immediate one is returned as it is.
func answer(_ reply: HTTPReply) async -> HTTPResponse? {
    let responder = RecordingResponder()
    guard reply.start(responder) else { return reply.immediate }
    _ = await eventually { !responder.responses.isEmpty }
    return responder.responses.first
}
