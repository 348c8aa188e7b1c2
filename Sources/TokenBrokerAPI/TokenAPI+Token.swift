import TokenBrokerCore
import TokenBrokerServer

extension TokenAPI {
    /// `GET /token`: the cached token with background refresh; without it, a token fetched for
    /// this request while its connection waits suspended.
    func token(_ endpoint: Endpoint, label: RequestCounter) -> HTTPReply {
        let provider = endpoint.provider
        guard !provider.configuration.backgroundRefreshEnabled else {
            let (response, summary) = cachedAnswer(endpoint)
            return record(label, .response(response ?? Self.unavailable(provider, wasPaused: summary.wasPaused)))
        }
        let deadline = provider.deadline(in: maxWait)
        return .deferred { [self] responder in
            let id = provider.addWaiter(after: nil, deadline: deadline, onDemand: true) { outcome in
                self.answer(responder, self.waitAnswer(outcome, endpoint, mode: .onDemand), route: label)
            }
            responder.onClose { provider.removeWaiter(id) }
        }
    }

    /// The cached token's answer (built once per version and second, copying no token), or nil
    /// when no valid token newer than `newerThan` is cached; with what the read saw. Counts as activity.
    func cachedAnswer(_ endpoint: Endpoint, newerThan: UInt64 = 0) -> (HTTPResponse?, CacheSummary) {
        let provider = endpoint.provider
        let summary = provider.readSummary()
        guard let version = summary.version, version > newerThan,
            let response = endpoint.responses.response(for: summary, version: version, token: provider.peekToken, now: provider.clock.now)
        else { return (nil, summary) }
        if summary.stale { metrics.recordStaleServed(provider: provider.name) }
        return (response, summary)
    }
}
