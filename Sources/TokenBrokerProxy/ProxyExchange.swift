import Synchronization
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerUpstream

/// One proxied request, from the token to the last byte of the answer.
///
/// 1. Take the provider's token (waiting for one, suspended, if there is none yet: at most the
///    shorter of `maxWaitSec` and what is left of `timeoutMsec`, then 503 `token_unavailable`).
/// 2. Send the request upstream with the token put in; the answer streams back as it comes.
/// 3. If the answer's status is in `retryOn` (and has `retryOnHeader`, when set), and the request
///    can be sent again exactly (its body was read whole, or it had none): read that answer
///    instead of passing it on, force one refresh with the refused version (single flight,
///    within the refresh window), and send the request once more. If no new token comes before
///    the exchange's `timeoutMsec` is up, or the refresh's fetch fails, the first answer is
///    passed on after all, whole. A refused answer whose body is longer than 64 KiB is not
///    held: it is passed on as it comes, with no retry.
///
/// With caller keys, the caller let in as the request arrived is asked again (`CallerRecheck`)
/// before each attempt goes upstream, and before an answer of the broker's own given after a
/// wait (503 `token_unavailable`, or a refused answer passed on after all): a caller whose key
/// was removed from `clientKeysFile` meanwhile (while its body came in, while it waited for a
/// token or a refresh, while the first attempt's answer came) gets 401 `invalid_caller_key`,
/// and one whose list no longer holds the provider 403 `provider_not_allowed`, as a token
/// route's waited request does; nothing more is sent upstream for it. An answer already being
/// passed on is not cut.
///
/// An answer's head that the connection's memory (`connectionMemoryKiB`) cannot hold, or that
/// cannot be passed on as it came (`UpstreamError.badResponse`), gets 502.
///
/// Upstream unreachable: 502; upstream too slow: 504; a token that cannot be a cookie value with
/// `inject: cookie`: 502 `token_not_cookie_safe`; all with the JSON error body (`ProxyFailure`).
///
/// One lock, `state`: the upstream exchange, the response stream and the responder are called
/// only after it is released, so their own locks are never taken inside it.
final class ProxyExchange: UpstreamExchangeDelegate, Sendable {
    enum Body: Sendable {
        case buffered([UInt8])
        case streamed(HTTPRequestBodyStream, length: Int?)
    }

    /// Where the current attempt's answer goes.
    private enum Mode {
        /// No answer head yet.
        case waiting
        /// A refused answer, kept in case no new token comes; `length` is its `Content-Length`.
        case collecting(status: Int, headers: [ProxyHeaders.Field], length: Int64?, body: [UInt8])
        /// Passing the answer on.
        case streaming(HTTPResponseStream)
        case done
    }

    private struct State {
        var mode = Mode.waiting
        var attempt = 0
        var upstream: UpstreamExchange?
        var responder: (any HTTPResponding)?
        var clientGone = false
        var rejectedVersion: UInt64 = 0
        /// The task waiting for a token (the first, or the retry's new one), which the client's
        /// going away cancels (`whileConnected`).
        var waiting: Task<Void, Never>?
    }

    private static let rejectedBodyLimit = 64 * 1024

    private let api: ProxyAPI
    private let route: ProxyAPI.Route
    private let method: String
    private let url: String
    /// The request's headers, values as the bytes sent.
    private let headers: [ProxyHeaders.Field]
    private let body: Body
    /// The most bytes of answer headers the client's connection can take (`ProxyAPI.answerHeadRoom`).
    private let answerHeadRoom: Int
    /// The broker's own `Via` (RFC 9110 §7.6.3), added after the caller's headers are filtered,
    /// so that a caller's `Connection` cannot take it off.
    private let via: ProxyHeaders.Field
    /// The caller let in, asked again before each attempt (nil: callers have no keys).
    private let caller: CallerRecheck?
    /// When the exchange's `timeoutMsec` is up: no wait for a token, and no attempt, goes past it.
    private let deadline: ContinuousClock.Instant
    private let state = Lock(State())

    init(
        api: ProxyAPI, route: ProxyAPI.Route, method: String, url: String, headers: [ProxyHeaders.Field], body: Body,
        answerHeadRoom: Int, via: ProxyHeaders.Field, caller: CallerRecheck?
    ) {
        self.api = api
        self.route = route
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.answerHeadRoom = answerHeadRoom
        self.via = via
        self.caller = caller
        deadline = .now + .milliseconds(route.configuration.upstream.timeoutMsec)
    }

    private var name: String { route.configuration.name }
    private var provider: ProxyAPI.Provider { route.provider }

    /// Whether the request has a body (libcurl would give it a `Content-Type` of its own).
    private var hasBody: Bool {
        switch body {
        case .buffered(let bytes): !bytes.isEmpty
        case .streamed: true
        }
    }

    /// Whether the request can be sent a second time exactly as the first.
    private var replayable: Bool { if case .buffered = body { true } else { false } }

    func start(_ responder: any HTTPResponding) {
        state.withLock { $0.responder = responder }
        responder.whenConnectionEnds { [self] in
            let (upstream, waiting) = state.withLock { state -> (UpstreamExchange?, Task<Void, Never>?) in
                state.clientGone = true
                defer { state.waiting = nil }
                return (state.upstream, state.waiting)
            }
            upstream?.cancel()
            waiting?.cancel()
            if case .streamed(let stream, _) = body { stream.close() }
        }
        if case .streamed(let stream, _) = body {
            stream.whenAvailable { [weak self] in self?.state.withLock { $0.upstream }?.resumeSending() }
        }
        switch provider.read() {
        case .token(let token, _, _): send(token)
        case .unavailable: whileConnected { await self.sendWhenTokenReady(onDemand: false) }
        // Without background refresh the proxy reuses the last token fetched for it while valid.
        case .onDemand(let cached?): send(cached)
        case .onDemand(nil): whileConnected { await self.sendWhenTokenReady(onDemand: true) }
        }
    }

    /// Runs `work` (a wait for a token) in a task that the client's going away cancels: the wait
    /// ends then, and the provider no longer counts it among its waiters.
    private func whileConnected(_ work: @escaping @Sendable () async -> Void) {
        let task = Task { await work() }
        let gone = state.withLock { state -> Bool in
            if !state.clientGone { state.waiting = task }
            return state.clientGone
        }
        if gone { task.cancel() }
    }

    /// Waits for a token, as the token routes do, at most the shorter of `maxWaitSec` and what
    /// is left of the exchange's `timeoutMsec` (which covers the whole exchange); then sends the
    /// request with it, or answers 503 `token_unavailable` as the token routes would.
    /// - Parameter onDemand: `read` said `.onDemand`: wait for a token fetched for this request.
    ///   Inside the issuer's `Retry-After` no fetch is made: a wait that ends before it is
    ///   answered at once, as `/token`'s is.
    private func sendWhenTokenReady(onDemand: Bool) async {
        let token: ProxyAPI.Provider.Token?
        let timeout = min(api.maxWait, max(.zero, ContinuousClock.now.duration(to: deadline)))
        switch await provider.onTokenReady(after: nil, timeout: timeout, onDemand: onDemand) {
        case .token(let ready, _): token = ready
        // On demand, a fetch that used up its retries falls back to the previous valid token, as `/token` does.
        case .exhausted(let previous?, _) where onDemand: token = previous
        // A wait that ended with a valid token cached gets it, as `/token`'s does.
        case .timedOut(let current?, _): token = current
        // The broker stopping, or a reload removing the provider: as every waiting request.
        case .shuttingDown:
            finish(with: callerRefusal() ?? ErrorAnswer.shuttingDown.response)
            return
        case .timedOut, .exhausted, .cancelled: token = nil
        }
        guard let token else {
            finish(with: callerRefusal() ?? tokenUnavailable())
            return
        }
        send(token)
    }

    private func send(_ token: ProxyAPI.Provider.Token) {
        // Before every attempt: the first after a wait for the body or a token, and the retry.
        if let refusal = callerRefusal() {
            finish(with: refusal)
            return
        }
        let settings = route.configuration
        if settings.inject == .cookie, !TokenRules.isCookieValue(token.token.accessToken) {
            fail(.tokenNotCookieSafe)
            return
        }
        var request = UpstreamRequest(method: method, url: url, settings: settings.upstream)
        // Each attempt gets what is left of the exchange's `timeoutMsec`, which covers the whole
        // exchange (a wait for a token, a refused answer and the retry after it), not that much again.
        let left = ContinuousClock.now.duration(to: deadline)
        request.settings.timeoutMsec = max(1, Int(clamping: left.wholeMilliseconds))
        request.headers = ProxyHeaders.forward(
            headers, token: token.token.accessToken, injection: settings.inject, overwrite: settings.overwrite,
            cookieName: provider.configuration.cookie.tokenCookieName,
            callerKeyInAuthorization: api.callerKeysInAuthorization)
        request.headers.append(via)
        // What the request does not carry, libcurl is not to add of its own accord.
        if !request.headers.contains(named: "Accept") { request.withheld.append("Accept") }
        if hasBody, !request.headers.contains(named: "Content-Type") { request.withheld.append("Content-Type") }
        let upstream: UpstreamExchange
        switch body {
        case .buffered(let bytes):
            request.body = bytes
            upstream = UpstreamExchange(request: request, streamsBody: false, bodyLength: nil, delegate: self)
        case .streamed(_, let length):
            upstream = UpstreamExchange(request: request, streamsBody: true, bodyLength: length, delegate: self)
        }
        let go = state.withLock { state -> Bool in
            guard !state.clientGone else { return false }
            state.attempt += 1
            state.rejectedVersion = token.version
            state.mode = .waiting
            state.upstream = upstream
            return true
        }
        if go { UpstreamHTTPClient.shared.start(upstream) }
    }

    // MARK: - The upstream's answer (on the upstream client's thread)

    func upstreamHead(
        status: Int, headers: [ProxyHeaders.Field], length: Int64?, body first: UnsafeRawBufferPointer, complete: Bool
    ) -> Bool {
        let settings = route.configuration
        // libmicrohttpd builds the answer's head in the connection's memory: one too large for
        // it would reach the client as nothing at all, the connection closed.
        let passed = ProxyHeaders.back(headers)
        let headBytes = passed.reduce(0) { $0 + $1.0.utf8.count + $1.1.count + 4 }
        guard headBytes <= answerHeadRoom else {
            fail(
                .upstreamUnreachable(
                    "bad_response: the answer's head (\(headBytes) bytes) is larger than the client's connection"
                        + " can take (\(max(answerHeadRoom, 0)) bytes; see connectionMemoryKiB)"))
            return false
        }
        let refused =
            settings.retryOn.contains(status)
            && (settings.retryOnHeader.map { headers.contains(named: $0) } ?? true)
        let attempt = state.withLock { $0.attempt }
        // A refused answer too long to hold is passed on as it comes, whole, with no retry.
        if refused, attempt == 1, replayable, first.count <= Self.rejectedBodyLimit,
            (length ?? 0) <= Int64(Self.rejectedBodyLimit)
        {
            state.withLock {
                $0.mode = .collecting(status: status, headers: headers, length: length, body: Array(first))
            }
            return true
        }
        let bodyless = method == "HEAD" || status == 204 || status == 304 || status < 200
        if complete, !bodyless {
            // The whole answer came at once: it goes out as one buffer, with no stream between.
            state.withLock { $0.mode = .done }
            respond(HTTPResponse(status: status, body: Array(first), rawHeaders: passed))
            return true
        }
        _ = stream(
            status: status, headers: passed, length: length, first: first,
            declaredLength: status == 304 ? Self.declaredLength(headers) : nil)
        return true
    }

    /// A 304's own `Content-Length`, the length of the body it stands for, which libcurl does not
    /// report (it knows a 304 has none): RFC 9110's `1*DIGIT` only (no sign), the last one said,
    /// and below 2^64 - 1, libmicrohttpd's "unknown".
    static func declaredLength(_ headers: [ProxyHeaders.Field]) -> UInt64? {
        guard let said = headers.last(where: { $0.0.equalsIgnoringASCIICase("Content-Length") }) else { return nil }
        let digits = said.1.trimmingHTTPBlanks()
        guard !digits.isEmpty, digits.allSatisfy(\.isASCIIDigit),
            let length = UInt64(String(decoding: digits, as: UTF8.self)), length < .max
        else { return nil }
        return length
    }

    /// A refused answer held for a retry, passed on whole after all. One that has no body (to
    /// HEAD, a 304) says the length of the body it stands for, as one passed on as it comes does,
    /// not the 0 of the empty body held; without a length it says none and closes the connection.
    private func wholeAnswer(status: Int, headers: [ProxyHeaders.Field], length: Int64?, body: [UInt8])
        -> HTTPResponse
    {
        let passed = ProxyHeaders.back(headers)
        guard method == "HEAD" || status == 304 else {
            return HTTPResponse(status: status, body: body, rawHeaders: passed)
        }
        let stated = status == 304 ? Self.declaredLength(headers) : length.flatMap { $0 >= 0 ? UInt64($0) : nil }
        if let stated { return HTTPResponse(status: status, rawHeaders: passed, standingFor: stated) }
        let nothing = HTTPResponseStream(onDrained: {})
        nothing.finish()
        return HTTPResponse(status: status, rawHeaders: passed, stream: nothing, length: nil, framedByClose: true)
    }

    /// Passes the answer on as a stream, starting with `first`; returns what writing `first` did
    /// (false: the client is slow, pause). `declaredLength`: a 304's `Content-Length`.
    private func stream(
        status: Int, headers passed: [ProxyHeaders.Field], length: Int64?, first: UnsafeRawBufferPointer,
        declaredLength: UInt64? = nil
    ) -> Bool {
        let bodyless = method == "HEAD" || status == 204 || status == 304 || status < 200
        let empty = status == 204 || status == 304 || status < 200
        let stream = HTTPResponseStream { [weak self] in self?.state.withLock { $0.upstream }?.resumeReceiving() }
        // An answer to HEAD with no length would go out as libmicrohttpd frames one of unknown
        // length, chunked, and it then sends the last chunk (`0`) after the head, where the client
        // reads its next answer (RFC 9112 §6.3 rule 1: nothing follows a head answering HEAD).
        // Sent unchunked, with the connection closed after it, nothing follows.
        // A 304 says the length of the body it stands for (RFC 9110 §8.6), which libmicrohttpd
        // sends as the answer's length without sending a body: the upstream's. Without one it
        // is sent like that answer to HEAD, with no length at all, where libmicrohttpd 0.9.75
        // would say `Content-Length: 0` of an empty body and chunk one of unknown length.
        let response = HTTPResponse(
            status: status, rawHeaders: passed, stream: stream,
            length: status == 304 ? declaredLength : empty ? 0 : length.map { UInt64($0) },
            framedByClose: (status == 304 && declaredLength == nil) || (method == "HEAD" && length == nil && !empty))
        var accepted = true
        if bodyless && method != "HEAD" {
            stream.finish()
        } else if first.count > 0 {
            accepted = stream.write(first)  // an empty stream takes any first write whole
        }
        state.withLock { $0.mode = .streaming(stream) }
        respond(response)
        return accepted
    }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        enum Next {
            case write(HTTPResponseStream)
            case passOn(status: Int, headers: [ProxyHeaders.Field], length: Int64?, body: [UInt8])
            case none
        }
        let next = state.withLock { state -> Next in
            switch state.mode {
            case .collecting(let status, let headers, let length, var body):
                guard body.count + bytes.count <= Self.rejectedBodyLimit else {
                    return .passOn(status: status, headers: headers, length: length, body: body)
                }
                body.append(contentsOf: bytes)
                state.mode = .collecting(status: status, headers: headers, length: length, body: body)
                return .none
            case .streaming(let stream): return .write(stream)
            default: return .none
            }
        }
        switch next {
        case .write(let stream):
            return stream.write(bytes)
        case .passOn(let status, let headers, let length, let body):
            // Longer than a refused answer is held (no `Content-Length` said so): it goes on as
            // it is, whole, instead of being cut; the request is not sent again.
            let accepted = body.withUnsafeBytes {
                stream(status: status, headers: ProxyHeaders.back(headers), length: length, first: $0)
            }
            guard accepted,
                let stream = state.withLock({ state -> HTTPResponseStream? in
                    if case .streaming(let stream) = state.mode { stream } else { nil }
                })
            else {
                return false
            }
            return stream.write(bytes)
        case .none:
            return true
        }
    }

    func upstreamFinished(_ error: UpstreamError?) {
        // Nobody reads a streamed body any more: let the rest of it drain, so the answer can go.
        if case .streamed(let stream, _) = body { stream.close() }
        let mode = state.withLock { state -> Mode in
            let mode = state.mode
            if case .collecting = mode {} else { state.mode = .done }
            state.upstream = nil  // it holds this exchange as its delegate: let both go
            return mode
        }
        switch mode {
        case .streaming(let stream):
            stream.finish(failed: error != nil)
        case .collecting(let status, let headers, let length, let body) where error == nil:
            let rejected = wholeAnswer(status: status, headers: headers, length: length, body: body)
            whileConnected { await self.retry(rejected: rejected) }
        case .collecting, .waiting:
            if case .streamed(let stream, _) = body, stream.isTooLarge {
                fail(.bodyTooLarge)
            } else {
                fail(ProxyFailure(upstream: error))
            }
        case .done:
            break
        }
    }

    func upstreamReadBody(into buffer: UnsafeMutableRawBufferPointer) -> UpstreamBodyRead {
        guard case .streamed(let stream, _) = body else { return .end }
        switch stream.read(into: buffer) {
        case .bytes(let n): return .bytes(n)
        case .wait: return .wait
        case .end: return .end
        case .tooLarge: return .abort
        }
    }

    // MARK: - The retrier

    /// The token was refused: one forced refresh, then the request once more; or, if no new
    /// token comes, the refused answer after all.
    private func retry(rejected: HTTPResponse) async {
        let version = state.withLock { $0.rejectedVersion }
        let (decision, startedFetch) = provider.forceRefreshStartingFetch(rejected: version)
        if startedFetch { api.metrics.recordProxyRefresh(proxy: name) }
        var fresh: ProxyAPI.Provider.Token?
        switch decision {
        case .current(let token):
            fresh = token
        case .refreshing(let after):
            // No longer than the exchange has left (`timeoutMsec` covers the whole of it), and
            // not through the retries of a fetch that failed: the refused answer goes on then.
            let left = ContinuousClock.now.duration(to: deadline)
            if left > .zero,
                case .token(let token, _) = await provider.onTokenReady(
                    after: after ?? version, timeout: min(api.maxWait, left), forRefresh: true,
                    endsOnFailedFetch: true)
            {
                fresh = token
            }
        case .excessive:
            fresh = nil
        }
        // A caller refused by now gets neither the refused answer nor a retry.
        if let refusal = callerRefusal() {
            finish(with: refusal)
            return
        }
        guard let fresh, fresh.version != version else {
            finish(with: rejected)
            return
        }
        api.metrics.recordProxyRetry(proxy: name)
        send(fresh)
    }

    // MARK: - Answering

    /// 503 `token_unavailable`, saying what the token routes' says (`TokenAPI.unavailable`): the
    /// provider's last upstream error, and what is left of the issuer's `Retry-After`, else 1.
    private func tokenUnavailable() -> HTTPResponse {
        let status = provider.status()
        return ErrorAnswer.proxyTokenUnavailable(
            proxy: name, provider: provider.name, lastError: status.lastError, retryAfter: status.heldOffFor
        )
        .response
    }

    /// Nil while the caller let in may still read the provider by the callers listed now (or
    /// callers have no keys); else the 401 or 403 the caller would get arriving now.
    private func callerRefusal() -> HTTPResponse? { caller?.refusal()?.response }

    private func fail(_ failure: ProxyFailure) {
        finish(with: failure.response(route.configuration, provider: provider.name))
    }

    private func finish(with response: HTTPResponse) {
        state.withLock { $0.mode = .done }
        respond(response)
    }

    private func respond(_ response: HTTPResponse) {
        api.metrics.recordProxied(proxy: name, status: response.status)
        api.requestCounter.record(status: response.status)
        state.withLock { $0.responder }?.respond(response)
    }
}
