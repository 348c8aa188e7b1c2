// The way back to a deferred request in a test: it keeps the answer instead of sending it.
import Synchronization
import TokenBrokerServer

/// An `HTTPResponding` that records the answers and runs the close handlers when told.
final class RecordingResponder: HTTPResponding {
    private struct State {
        var responses: [HTTPResponse] = []
        var onClose: [@Sendable () -> Void] = []
        var whenEnds: [@Sendable () -> Void] = []
    }

    private let state = Mutex(State())

    func respond(_ response: HTTPResponse) { state.withLock { $0.responses.append(response) } }
    func onClose(_ cleanup: @escaping @Sendable () -> Void) { state.withLock { $0.onClose.append(cleanup) } }
    func whenConnectionEnds(_ work: @escaping @Sendable () -> Void) { state.withLock { $0.whenEnds.append(work) } }

    /// Every answer given, in order.
    var responses: [HTTPResponse] { state.withLock { $0.responses } }

    /// The client hangs up before an answer: the close handlers run.
    func hangUp() {
        for cleanup in state.withLock({ state in
            defer { state.onClose = [] }
            return state.onClose
        }) { cleanup() }
    }
}
