import TokenBrokerCore

extension TokenAPI {
    /// `GET /token`: the cached token with background refresh; without it, a token fetched for
    /// this request while its connection waits suspended.
    func token(_ endpoint: Endpoint, label: RequestCounter) -> HTTPReply {
        let provider = endpoint.provider
        guard !provider.configuration.backgroundRefreshEnabled else {
            let summary = provider.readSummary()
            guard let version = summary.version,
                let response = endpoint.responses.response(for: summary, version: version, token: provider.peekToken, now: provider.clock.now)
            else {
                return record(label, .response(Self.unavailable(provider, wasPaused: summary.wasPaused)))
            }
            if summary.stale { metrics.recordStaleServed(provider: provider.name) }
            return record(label, .response(response))
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
