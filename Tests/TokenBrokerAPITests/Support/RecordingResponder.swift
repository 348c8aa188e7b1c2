// The way back to a deferred request in a test: it keeps the answer instead of sending it.
import Synchronization
import TokenBrokerServer

/// An `HTTPResponding` that records the answers and runs the close handlers when told. The wait
/// ends, as `HTTPResponder`'s does, at the first answer or the hang-up, whichever comes first.
final class RecordingResponder: HTTPResponding {
    private struct State {
        var responses: [HTTPResponse] = []
        var onClose: [@Sendable () -> Void] = []
        var whenEnds: [@Sendable () -> Void] = []
        var waitEnds: [@Sendable () -> Void] = []
        var waitEnded = false

        /// Ends the wait, once: the work to run for it.
        mutating func endWait() -> [@Sendable () -> Void] {
            guard !waitEnded else { return [] }
            waitEnded = true
            defer { waitEnds = [] }
            return waitEnds
        }
    }

    private let state = Mutex(State())

    func respond(_ response: HTTPResponse) {
        for work in state.withLock({ state in
            state.responses.append(response)
            return state.endWait()
        }) { work() }
    }

    func onClose(_ cleanup: @escaping @Sendable () -> Void) { state.withLock { $0.onClose.append(cleanup) } }
    func whenConnectionEnds(_ work: @escaping @Sendable () -> Void) { state.withLock { $0.whenEnds.append(work) } }

    func whenWaitEnds(_ work: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state in
            if !state.waitEnded { state.waitEnds.append(work) }
            return state.waitEnded
        }
        if runNow { work() }
    }

    /// Every answer given, in order.
    var responses: [HTTPResponse] { state.withLock { $0.responses } }

    /// The client hangs up before an answer: the close handlers run, and the wait ends.
    func hangUp() {
        let (cleanups, ended) = state.withLock { state in
            defer { state.onClose = [] }
            return (state.onClose, state.endWait())
        }
        for cleanup in cleanups { cleanup() }
        for work in ended { work() }
    }
}
