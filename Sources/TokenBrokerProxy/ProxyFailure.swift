import TokenBrokerCore
import TokenBrokerHTTP
import TokenBrokerSources

/// Why a proxied request gets the broker's own answer instead of its target's, and that answer.
///
/// Every answer is the JSON error body; the texts name the proxy, never the token.
enum ProxyFailure: Equatable {
    /// The method is not forwarded (TRACE, CONNECT, anything unknown): 405 with `Allow`.
    case methodNotAllowed(String)
    /// The request's body is longer than the proxy's `maxBodyBytes`: 413.
    case bodyTooLarge
    /// With `inject: cookie`, the token holds a character a cookie value cannot: 502.
    case tokenNotCookieSafe
    /// The target did not answer in time: 504.
    case upstreamTimeout
    /// The target could not be reached, or its answer broke off before its head: 502, with why.
    case upstreamUnreachable(String)

    /// What an upstream exchange that ended without passing an answer on amounts to; nil
    /// `error` is an exchange that ended cleanly without a head.
    init(upstream error: UpstreamError?) {
        switch error {
        case nil: self = .upstreamUnreachable("the target gave no answer")
        case .timeout?: self = .upstreamTimeout
        case .unreachable(let detail)?: self = .upstreamUnreachable(detail.isEmpty ? "unreachable" : "unreachable: \(detail)")
        case .clientFailure(let detail)?: self = .upstreamUnreachable("internal: \(detail)")
        case .settingsRefused?: self = .upstreamUnreachable("configuration: \(UpstreamError.settingsRefusedDetail)")
        case .tooLarge(let limit)?: self = .upstreamUnreachable("bad_response: the answer is larger than \(limit) bytes")
        case .stopped?: self = .upstreamUnreachable("internal: stopped")
        }
    }

    /// The answer for a request to proxy `settings`, whose token comes from provider `provider`.
    func response(_ settings: ProxyConfiguration, provider: String) -> HTTPResponse {
        let proxy = JSONText.quoted(settings.name)
        switch self {
        case .methodNotAllowed(let method):
            let allowed = ProxyAPI.methods.joined(separator: ", ")
            return .error(
                405, "method_not_allowed", "\(String(method.prefix(32))) is not forwarded; allowed: \(allowed)",
                headers: [("Allow", allowed)])
        case .bodyTooLarge:
            return .error(413, "payload_too_large", "proxy \(proxy) accepts bodies up to \(settings.maxBodyBytes) bytes")
        case .tokenNotCookieSafe:
            return .error(
                502, "token_not_cookie_safe",
                "proxy \(proxy): the token of provider \(JSONText.quoted(provider)) holds a character a cookie value cannot (RFC 6265), so it is not sent")
        case .upstreamTimeout:
            return .error(504, "upstream_timeout", "proxy \(proxy): the target did not answer within \(settings.upstream.timeoutMsec) ms")
        case .upstreamUnreachable(let detail):
            return .error(502, "upstream_unreachable", "proxy \(proxy): \(detail)")
        }
    }
}
