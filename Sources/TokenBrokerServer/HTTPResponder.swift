internal import CMicroHTTPD
import Glibc
import Synchronization
import TokenBrokerCore

/// The way back to a suspended connection: give it a response and the connection resumes.
///
/// Answering twice, or after the client hung up, does nothing. `onClose` runs once when the
/// connection ends without an answer (client gone or server stopping), to free what waits for
/// it, at once when registered after that.
///
/// The wait ends once, at whichever comes first of the answer, the hang-up and the connection's
/// end: that step leaves `.waiting` under the lock, and only it runs the `whenWaitEnds` work and
/// gives back the listener's waiting place, when the responder holds one.
public final class HTTPResponder: HTTPResponding {
    fileprivate enum Phase {
        case waiting(Waiting)
        case answered(HTTPResponse)
        case sent
        case closed
    }

    /// What runs when the wait ends: `onClose` only when it ends without an answer.
    fileprivate struct Waiting {
        var onClose: (@Sendable () -> Void)?
        var onEnd: (@Sendable () -> Void)?
    }

    private let phase = Lock<Phase>(.waiting(Waiting()))
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
    /// The responder of a deferred answer holds one of the server's waiting places
    /// (`WaitingPlaces`) until its wait ends; one made for a streamed answer holds none.
    private let holdsWaitingPlace: Bool
    /// The request is a HEAD: an answer written straight to the socket says its body's length
    /// and sends none (`HTTPServer.completed`).
    let answersHead: Bool
    /// The connection's place among the server's suspended ones, or -1 when it is not
    /// suspended. Changed only under the server's lock of suspended connections; read without
    /// it too, so that finishing a request can skip that lock when the connection was resumed.
    let suspendedSlot = Atomic<Int>(-1)

    /// - Parameters:
    ///   - holdsWaitingPlace: the server took one of its waiting places for this request, which
    ///     the responder gives back when the wait ends.
    ///   - answersHead: the request is a HEAD.
    init(
        connection: OpaquePointer, fd: Int32, server: HTTPServer, holdsWaitingPlace: Bool = false,
        answersHead: Bool = false
    ) {
        self.connection = connection
        self.fd = fd
        self.server = server
        self.holdsWaitingPlace = holdsWaitingPlace
        self.answersHead = answersHead
    }

    /// Answers the suspended request and resumes its connection.
    public func respond(_ response: HTTPResponse) {
        let ended = phase.withLock { phase -> Waiting? in
            guard case .waiting(let waiting) = phase else { return nil }
            phase = .answered(response)
            return waiting
        }
        guard let ended else { return }
        waitEnded(ended)
        server.resume(self)
    }

    /// Registers a cleanup to run if the connection ends before an answer.
    public func onClose(_ cleanup: @escaping @Sendable () -> Void) {
        let runNow = phase.withLock { phase -> Bool in
            guard case .waiting(var waiting) = phase else {
                return phase.isClosed || clientGone.load(ordering: .relaxed)
            }
            waiting.onClose = cleanup
            phase = .waiting(waiting)
            return false
        }
        if runNow { cleanup() }
    }

    /// Registers work to run once when the wait ends (answered, hung up or closed); at once
    /// when it has ended.
    public func whenWaitEnds(_ work: @escaping @Sendable () -> Void) {
        let runNow = phase.withLock { phase -> Bool in
            guard case .waiting(var waiting) = phase else { return true }
            if let earlier = waiting.onEnd {
                waiting.onEnd = { @Sendable in
                    earlier()
                    work()
                }
            } else {
                waiting.onEnd = work
            }
            phase = .waiting(waiting)
            return false
        }
        if runNow { work() }
    }

    /// The wait ended (the phase left `.waiting`, once): its work runs and the waiting place is
    /// given back, before the connection resumes.
    private func waitEnded(_ waiting: Waiting) {
        waiting.onEnd?()
        if holdsWaitingPlace { server.waitingPlaces.giveBack() }
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
    /// close the connection; a client that only half-closed still reads the answer (through
    /// libmicrohttpd, or when it closes the connection first, straight: `HTTPServer.completed`).
    func clientHungUp() {
        let ended = phase.withLock { phase -> Waiting? in
            guard case .waiting(let waiting) = phase else { return nil }
            phase = .answered(server.clientClosedAnswer)
            clientGone.store(true, ordering: .relaxed)
            return waiting
        }
        guard let ended else { return }
        ended.onClose?()
        waitEnded(ended)
        server.resume(self)
    }

    /// The connection ended; runs the cleanup if no answer was given.
    func connectionClosed() {
        let ended = phase.withLock { phase -> Waiting? in
            defer { phase = .closed }
            if case .waiting(let waiting) = phase { return waiting }
            return nil
        }
        if let ended {
            ended.onClose?()
            waitEnded(ended)
        }
        for work in endHandlers.withLock({ handlers in
            defer { handlers = [] }
            return handlers
        }) { work() }
    }
}

extension HTTPResponder.Phase {
    fileprivate var isClosed: Bool { if case .closed = self { true } else { false } }
}
