import TokenBrokerCore
import TokenBrokerServer

extension TokenAPI {
    /// How a wait's outcome becomes an answer.
    enum WaitMode {
        /// `/token/ready`, and `/token/refresh` (whose answer is the same): `conditional` when
        /// the client named a version it already has.
        case ready(conditional: Bool)
        /// `/token` without background refresh.
        case onDemand
    }

    /// `GET /token/ready?after=N&timeout=S` (or `If-None-Match: "N"`): answers 200 as soon as a
    /// valid token newer than N is cached, 304 when none came in time, 503 when no valid token
    /// could be had. The connection waits suspended, not a thread.
    /// - Parameter caller: the caller let in, checked again when a wait ends (nil: no keys).
    func ready(_ endpoint: Endpoint, _ poll: LongPollParameters, caller: AdmittedCaller?, label: RequestCounter)
        -> HTTPReply
    {
        let provider = endpoint.provider
        let after = poll.after { provider.status().version }
        // The common case needs no suspension: a newer valid token is already cached.
        if case .token(let token, let stale, let secondsLeft) = provider.read(newerThan: after ?? 0) {
            return record(label, .response(cachedAnswer(endpoint, token, stale: stale, secondsLeft: secondsLeft)))
        }
        return wait(
            endpoint, after: after, timeout: poll.timeout, mode: .ready(conditional: after != nil), caller: caller,
            label: label)
    }

    /// Suspends the request until the provider completes its waiter.
    /// - Parameters:
    ///   - forRefresh: the wait of a forced refresh (see `ProviderStateMachine.addWaiter`).
    ///   - caller: the caller let in, checked again when the wait ends: a caller the callers
    ///     listed by then refuse gets the refusal, not the token (nil: callers have no keys).
    func wait(
        _ endpoint: Endpoint, after: UInt64?, timeout: Duration, mode: WaitMode, forRefresh: Bool = false,
        caller: AdmittedCaller?, label: RequestCounter
    ) -> HTTPReply {
        let provider = endpoint.provider
        let deadline = provider.deadline(in: timeout)
        return deferred(caller: caller, label: label) { [self] responder in
            let id = provider.addWaiter(after: after, deadline: deadline, onDemand: false, forRefresh: forRefresh) {
                outcome in
                self.answer(responder, caller: caller, route: label) { self.waitAnswer(outcome, endpoint, mode: mode) }
            }
            responder.onClose { provider.removeWaiter(id) }
        }
    }

    /// The answer to a finished wait.
    func waitAnswer(_ outcome: ProviderStateMachine<Provider.Instant>.WaitOutcome, _ endpoint: Endpoint, mode: WaitMode)
        -> HTTPResponse
    {
        let provider = endpoint.provider
        let now = provider.now
        func tokenAnswer(_ token: CachedToken<Provider.Instant>, stale: Bool) -> HTTPResponse {
            if stale { metrics.recordStaleServed(provider: provider.name) }
            if case .onDemand = mode {
                return TokenResponseCache.render(
                    token, stale: stale, expiresIn: token.secondsLeft(at: now), provider: provider.name,
                    cookie: provider.cookie)
            }
            return endpoint.responses.response(for: token, stale: stale, now: now)
        }
        switch outcome {
        case .token(let token, let stale):
            return tokenAnswer(token, stale: stale)
        case .exhausted(let previous?, _):
            return tokenAnswer(previous, stale: true)
        case .exhausted(nil, _):
            return Self.unavailable(provider)
        case .timedOut(let current?, _):
            switch mode {
            case .ready(conditional: true):
                // With the length of the token's answer, which the request would have had without
                // its condition (RFC 9110 §8.6): not 0.
                let full = endpoint.responses.response(for: current, stale: provider.status().stale, now: now)
                return HTTPResponse(
                    status: 304, headers: [("ETag", "\"\(current.version)\""), ("Cache-Control", "no-store")],
                    standingFor: full.body.count)
            case .ready(conditional: false), .onDemand:
                return tokenAnswer(current, stale: provider.status().stale)
            }
        case .timedOut(nil, _), .cancelled:
            // A cancelled waiter's connection is gone; it is answered as a wait without a token.
            return Self.unavailable(provider)
        case .shuttingDown:
            return ErrorAnswer.shuttingDown.response
        }
    }
}

/// `/token/ready`'s parameters, read before its provider is known (`TokenAPI.RouteParameters`).
struct LongPollParameters {
    /// `after`; nil when not given.
    let after: UInt64?
    /// `If-None-Match`, read when `after` is not given; nil when neither is.
    let entityTags: QueryParameters.EntityTags?
    let timeout: Duration

    init(_ request: HTTPRequest, maxWait: Duration) throws(BadRequest) {
        after = try QueryParameters.version("after", request)
        entityTags = after == nil ? QueryParameters.entityTags(request) : nil
        timeout = try QueryParameters.timeout(request, maximum: maxWait)
    }

    /// The version the client has: `after`, else what `If-None-Match` says (for `*`, `current`,
    /// the version the provider holds now); nil when neither names one.
    func after(current: () -> UInt64?) -> UInt64? {
        after ?? entityTags?.version(current: current)
    }
}
