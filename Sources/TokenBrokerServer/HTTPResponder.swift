internal import CMicroHTTPD
import Glibc
import Synchronization
import TokenBrokerCore

/// The way back to a suspended connection: give it a response and the connection resumes.
///
/// Answering twice, or after the client hung up, does nothing. `onClose` runs once when the
/// connection ends without an answer (client gone or server stopping), to free what waits for
/// it, at once when registered after that.
public final class HTTPResponder: HTTPResponding {
    fileprivate enum Phase {
        case waiting(onClose: (@Sendable () -> Void)?)
        case answered(HTTPResponse)
        case sent
        case closed
    }

    private let phase = Lock<Phase>(.waiting(onClose: nil))
    /// The client hung up before an answer (`clientHungUp`). Read and written under `phase`'s
    /// lock: a cleanup registered after that (the hang-up can be seen between the connection's
    /// suspension and the handler's `onClose`) runs at once, as it would after `.closed`.
    private let clientGone = Atomic<Bool>(false)
    private let endHandlers = Lock<[@Sendable () -> Void]>([])
    // Written once before the responder is handed out, then only read.
    nonisolated(unsafe) let connection: OpaquePointer
    /// The connection's socket, watched for hang-ups while suspended.
    let fd: Int32
    /// Held strongly: waking thousands of waiters then costs no weak-reference load each, and
    /// a responder answered after the server stopped finds its connection no longer suspended.
    private let server: HTTPServer
    /// The connection's place among the server's suspended ones, or -1 when it is not
    /// suspended. Changed only under the server's lock of suspended connections; read without
    /// it too, so that finishing a request can skip that lock when the connection was resumed.
    let suspendedSlot = Atomic<Int>(-1)

    init(connection: OpaquePointer, fd: Int32, server: HTTPServer) {
        self.connection = connection
        self.fd = fd
        self.server = server
    }

    /// Answers the suspended request and resumes its connection.
    public func respond(_ response: HTTPResponse) {
        let resume = phase.withLock { phase -> Bool in
            guard case .waiting = phase else { return false }
            phase = .answered(response)
            return true
        }
        if resume { server.resume(self) }
    }

    /// Registers a cleanup to run if the connection ends before an answer.
    public func onClose(_ cleanup: @escaping @Sendable () -> Void) {
        let runNow = phase.withLock { phase -> Bool in
            guard case .waiting = phase else { return phase.isClosed || clientGone.load(ordering: .relaxed) }
            phase = .waiting(onClose: cleanup)
            return false
        }
        if runNow { cleanup() }
    }

    /// Registers work to run once when the connection ends, answered or not (such as stopping an
    /// upstream exchange that feeds a streamed answer).
    public func whenConnectionEnds(_ work: @escaping @Sendable () -> Void) {
        endHandlers.withLock { $0.append(work) }
    }

    /// Whether an answer waits to be queued.
    var hasAnswer: Bool { phase.withLock { if case .answered = $0 { true } else { false } } }

    /// Suspends the connection while a stream waits for bytes; false when the server is stopping.
    func suspendForStream() -> Bool { server.suspendForStream(self) }

    /// Resumes a connection suspended by `suspendForStream` (or waiting for its answer).
    func resumeStream() { server.resume(self) }

    /// Shuts the connection's socket down both ways: the client sees the end at once, and
    /// libmicrohttpd sees the hang-up and frees the connection. Only while libmicrohttpd still
    /// holds the socket open, as inside one of its callbacks for this connection.
    func shutDownSocket() {
        if fd >= 0 { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// The answer to queue once the connection is back, taken once.
    func takeAnswer() -> HTTPResponse? {
        phase.withLock { phase in
            guard case .answered(let response) = phase else { return nil }
            phase = .sent
            return response
        }
    }

    /// The client went away while suspended: free what waits for it, then let libmicrohttpd
    /// close the connection; a client that only half-closed still reads the answer.
    func clientHungUp() {
        let (wasWaiting, cleanup) = phase.withLock { phase -> (Bool, (@Sendable () -> Void)?) in
            guard case .waiting(let onClose) = phase else { return (false, nil) }
            phase = .answered(server.clientClosedAnswer)
            clientGone.store(true, ordering: .relaxed)
            return (true, onClose)
        }
        guard wasWaiting else { return }
        cleanup?()
        server.resume(self)
    }

    /// The connection ended; runs the cleanup if no answer was given.
    func connectionClosed() {
        let cleanup = phase.withLock { phase -> (@Sendable () -> Void)? in
            defer { phase = .closed }
            if case .waiting(let onClose) = phase { return onClose }
            return nil
        }
        cleanup?()
        for work in endHandlers.withLock({ handlers in
            defer { handlers = [] }
            return handlers
        }) { work() }
    }
}

extension HTTPResponder.Phase {
    fileprivate var isClosed: Bool { if case .closed = self { true } else { false } }
}
