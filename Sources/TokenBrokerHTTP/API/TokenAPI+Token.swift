import TokenBrokerCore

extension TokenAPI {
    /// `GET /token`: the cached token with background refresh; without it, a token fetched for
    /// this request while its connection waits suspended.
    func token(_ endpoint: Endpoint, label: String) -> HTTPReply {
        let provider = endpoint.provider
        guard !provider.configuration.backgroundRefreshEnabled else {
            let read = provider.readCache()
            guard let token = read.token else {
                return record(label, .response(Self.unavailable(provider, wasPaused: read.wasPaused)))
            }
            let stale = read.stale
            if stale { metrics.recordStaleServed(provider: provider.name) }
            return record(label, .response(endpoint.responses.response(for: token, stale: stale, now: provider.clock.now)))
        }
        let deadline = provider.deadline(in: maxWait)
        return .deferred { [self] responder in
            let id = provider.addWaiter(after: nil, deadline: deadline, onDemand: true) { outcome in
                self.answer(responder, self.waitAnswer(outcome, endpoint, mode: .onDemand), route: label)
            }
            responder.onClose { provider.removeWaiter(id) }
        }
    }
}
