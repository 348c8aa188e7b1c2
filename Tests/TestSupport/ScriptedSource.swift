// A scripted token source for the tests of the provider, its templates and the token files' sinks.
import Synchronization
import TokenBrokerCore

/// A token source whose answers a test decides, and which counts its fetches.
///
/// Each fetch takes the next scripted answer (the last repeats). With `gated`, every fetch waits
/// until the test calls `open()`, so that many callers can pile up on one fetch.
public final class ScriptedSource: TokenSource {
    public enum Answer: Sendable {
        case token(lifetime: Duration?)
        case failure(TokenFetchError)
    }

    private struct State {
        var answers: [Answer]
        var fetches = 0
        var gateOpen: Bool
        var parked: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Lock<State>
    /// What each token's access token starts with, before the fetch's number.
    private let prefix: String

    /// - Parameter prefix: tokens are `prefix` and the fetch's number: "token-1", "token-2" and
    ///   so on by default; another prefix makes tokens no other source's fetches bring.
    public init(_ answers: [Answer] = [.token(lifetime: .seconds(900))], gated: Bool = false, prefix: String = "token-")
    {
        state = Lock(State(answers: answers, gateOpen: !gated))
        self.prefix = prefix
    }

    public var fetchCount: Int { state.withLock { $0.fetches } }
    public var parkedCount: Int { state.withLock { $0.parked.count } }

    public func script(_ answers: [Answer]) { state.withLock { $0.answers = answers } }

    /// Lets every waiting and future fetch through.
    public func open() {
        let parked = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.gateOpen = true
            defer { state.parked = [] }
            return state.parked
        }
        for continuation in parked { continuation.resume() }
    }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        let (number, answer) = state.withLock { state -> (Int, Answer) in
            state.fetches += 1
            let answer = state.answers.count > 1 ? state.answers.removeFirst() : state.answers[0]
            return (state.fetches, answer)
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = state.withLock { state -> Bool in
                if state.gateOpen { return true }
                state.parked.append(continuation)
                return false
            }
            if proceed { continuation.resume() }
        }
        switch answer {
        case .token(let lifetime):
            return FetchedToken(accessToken: "\(prefix)\(number)", lifetime: lifetime)
        case .failure(let error):
            throw error
        }
    }
}
