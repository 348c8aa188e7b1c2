import TokenBrokerCore
import TokenBrokerServer

extension TokenAPI {
    /// `POST /token/refresh` with the optional body `{"rejected_version": N}`: the retrier.
    ///
    /// A client whose token was refused downstream (401) asks for a new one. If N is the current
    /// version, or absent, the provider refreshes once for everybody (single flight) and the answer
    /// comes as from `/token/ready?after=N`: a newer token; when none came in time (the issuer
    /// fails), 304 with the current `ETag` if N was sent, else the cached token, flagged stale
    /// while refresh fails; 503 only when no valid token is cached. A refresh that brings back
    /// the same token ends the wait with it, under its unchanged version. If N is older, the current
    /// token comes back at once. Past the refresh window: 429 `excessive_refresh` with `Retry-After`.
    /// A caller whose key holds its share of waiting places (`KeyWaitingPlaces`) gets 429
    /// `too_many_waiting_for_key` before any refresh is forced, unless N is older.
    ///
    /// - Parameters:
    ///   - rejected: the body's N; nil when not sent.
    ///   - timeout: how long the request waits for a new token (`timeout`, at least 1 s).
    ///   - caller: the caller let in, checked again when the wait ends (nil: no keys).
    func refresh(
        _ endpoint: Endpoint, rejected: UInt64?, timeout: Duration, caller: AdmittedCaller?, label: RequestCounter
    ) -> HTTPReply {
        let provider = endpoint.provider
        // A key that may not wait does not start the refresh it would wait for (a version older
        // than the one held is answered at once, and goes on). The listener's own cap refuses the
        // wait only once it is returned (`ServerRefusal.tooManyWaiting`): the refresh is forced
        // by then, within the refresh window, and answers the requests already waiting.
        if keyHoldsItsShare(caller), (rejected ?? .max) >= (provider.status().version ?? 0) {
            return record(label, .response(keyShareRefusal()))
        }
        switch provider.forceRefresh(rejected: rejected) {
        case .current(let token):
            let stale = provider.status().stale
            if stale { metrics.recordStaleServed(provider: provider.name) }
            return record(label, .response(endpoint.responses.response(for: token, stale: stale, now: provider.now)))
        case .excessive(let retryAfter):
            metrics.recordExcessiveRefresh(provider: provider.name)
            let limit = provider.forcedRefreshLimit
            let answer = ErrorAnswer.excessiveRefresh(
                provider: provider.name, attempts: limit.attempts, windowSeconds: limit.windowSeconds,
                retryAfter: retryAfter)
            return record(label, .response(answer.response))
        case .refreshing(let after):
            return wait(
                endpoint, after: after ?? rejected, timeout: timeout, mode: .ready(conditional: rejected != nil),
                forRefresh: true, caller: caller, label: label)
        }
    }
}

/// Reads `{"rejected_version": N}`; an empty body means "whatever is current".
enum RefreshRequestBody {
    static func rejectedVersion(_ request: HTTPRequest) throws(BadRequest) -> UInt64? {
        if request.bodyTooLarge {
            throw BadRequest(.bodyTooLarge)
        }
        guard request.body.contains(where: { !$0.isWhitespace }) else { return nil }
        let document: JSONValue
        do {
            document = try JSONValue(parsing: request.body)
        } catch {
            throw BadRequest(.refreshBodyNotObject)
        }
        guard case .object(let members) = document else {
            throw BadRequest(.refreshBodyNotObject)
        }
        if let unknown = members.keys.sorted().first(where: { $0 != "rejected_version" }) {
            throw BadRequest(.refreshBodyUnknownKey(unknown))
        }
        guard let value = members["rejected_version"] else { return nil }
        if case .number(let number) = value, number.value < 1e15, let version = UInt64(exactly: number.value) {
            return version
        }
        throw BadRequest(.invalidRejectedVersion)
    }
}

extension UInt8 {
    fileprivate var isWhitespace: Bool { self == 0x20 || self == 0x09 || self == 0x0A || self == 0x0D }
}
