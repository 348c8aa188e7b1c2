import TokenBrokerCore
import TokenBrokerServer

extension TokenAPI {
    /// `GET /token`: the cached token with background refresh; without it, a token fetched for
    /// this request while its connection waits suspended.
    /// - Parameter waitForFirstToken: a template's child: while it never held a token and its
    ///   first fetch has not failed (it was made for this request, or a concurrent one), the
    ///   request waits for its first, at most `maxWait`, as `/token/ready` would, sharing the
    ///   child's one fetch. Once that fetch failed, later requests get the 503 at once, with the
    ///   error, as a configured provider's do: a failing issuer does not hold each caller for `maxWait`.
    /// - Parameter caller: the caller let in, checked again when a wait ends (nil: no keys).
    func token(
        _ endpoint: Endpoint, waitForFirstToken: Bool = false, caller: AdmittedCaller?, label: RequestCounter
    ) -> HTTPReply {
        let provider = endpoint.provider
        switch provider.read() {
        case .token(let token, let stale, let secondsLeft):
            return record(label, .response(cachedAnswer(endpoint, token, stale: stale, secondsLeft: secondsLeft)))
        case .unavailable(let wasPaused, let awaitingFirstToken):
            // A first token that comes just after the read completes the waiter at once.
            if waitForFirstToken, awaitingFirstToken {
                return wait(
                    endpoint, after: nil, timeout: maxWait, mode: .ready(conditional: false), caller: caller,
                    label: label)
            }
            return record(label, .response(Self.unavailable(provider, wasPaused: wasPaused)))
        case .onDemand:
            break
        }
        let deadline = provider.deadline(in: maxWait)
        return deferred(caller: caller, label: label) { [self] responder in
            let id = provider.addWaiter(after: nil, deadline: deadline, onDemand: true, forRefresh: false) { outcome in
                self.answer(responder, caller: caller, route: label) {
                    self.waitAnswer(outcome, endpoint, mode: .onDemand)
                }
            }
            responder.onClose { provider.removeWaiter(id) }
        }
    }

    /// The answer for a token the read found (built once per version and second), counting it
    /// when stale.
    func cachedAnswer(_ endpoint: Endpoint, _ token: CachedToken<Provider.Instant>, stale: Bool, secondsLeft: Int?)
        -> HTTPResponse
    {
        if stale { metrics.recordStaleServed(provider: endpoint.provider.name) }
        return endpoint.responses.response(for: token, stale: stale, secondsLeft: secondsLeft)
    }
}
