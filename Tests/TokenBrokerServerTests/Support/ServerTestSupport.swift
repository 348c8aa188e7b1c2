// What the server tests share: a server on a loopback port, and blocking work kept off the cooperative pool.
import Foundation
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerUpstream

/// How a test's server polls its connections: on threads of its own, or on the HTTP client's
/// event loops, one daemon per loop (the token listener, when proxies are configured).
enum Polling: String, CaseIterable, CustomTestStringConvertible {
    case ownThreads, eventLoops
    var testDescription: String { rawValue }
}

/// Starts a server on 127.0.0.1, on a port the kernel picks, with `handler`.
func startServer(
    _ handler: TestHandler, _ polling: Polling = .ownThreads,
    configure: (inout HTTPServer.Configuration) -> Void = { _ in }
) throws -> HTTPServer {
    var configuration = HTTPServer.Configuration(address: try ListenAddress(parsing: "127.0.0.1:0"))
    if polling == .eventLoops {
        if let failure = UpstreamHTTPClient.shared.startProxyLoops() { throw LoopsFailed(reason: failure) }
        configuration.eventLoops = UpstreamHTTPClient.shared.eventLoops
    }
    configure(&configuration)
    return try HTTPServer(configuration: configuration, handler: handler)
}

struct LoopsFailed: Error { let reason: String }

/// Work that may block (such as `HTTPServer.shutDown`), run on a thread of its own so that it
/// never holds one of Swift's cooperative threads.
final class BackgroundWork: Sendable {
    private let done = Atomic<Bool>(false)

    init(_ work: @escaping @Sendable () -> Void) {
        Thread.detachNewThread {
            work()
            self.done.store(true, ordering: .releasing)
        }
    }

    /// Whether the work has returned.
    var isDone: Bool { done.load(ordering: .acquiring) }
}
