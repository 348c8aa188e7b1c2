import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerUpstream

/// Why a proxied request gets the broker's own answer instead of its target's. Its words are
/// `ErrorAnswer`'s, with every other error answer; they name the proxy, never the token.
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
        case .unreachable(let detail)?:
            self = .upstreamUnreachable(detail.isEmpty ? "unreachable" : "unreachable: \(detail)")
        case .clientFailure(let detail)?: self = .upstreamUnreachable("internal: \(detail)")
        case .settingsRefused?: self = .upstreamUnreachable("configuration: \(UpstreamError.settingsRefusedDetail)")
        case .unreadableFile(let detail)?: self = .upstreamUnreachable("configuration: \(detail)")
        case .tooLarge(let limit)?:
            self = .upstreamUnreachable("bad_response: the answer is larger than \(limit) bytes")
        case .badResponse(let detail)?: self = .upstreamUnreachable("bad_response: \(detail)")
        case .stopped?: self = .upstreamUnreachable("internal: stopped")
        }
    }

    /// The error answer (`ErrorAnswer`, where every answer's text lives) for a request to proxy
    /// `settings`, whose token comes from provider `provider`.
    func answer(_ settings: ProxyConfiguration, provider: String) -> ErrorAnswer {
        switch self {
        case .methodNotAllowed(let method): .methodNotForwarded(method: method, allow: ProxyAPI.methods)
        case .bodyTooLarge: .proxyBodyTooLarge(proxy: settings.name, maxBytes: settings.maxBodyBytes)
        case .tokenNotCookieSafe: .tokenNotCookieSafe(proxy: settings.name, provider: provider)
        case .upstreamTimeout: .upstreamTimeout(proxy: settings.name, timeoutMsec: settings.upstream.timeoutMsec)
        case .upstreamUnreachable(let detail): .upstreamUnreachable(proxy: settings.name, problem: detail)
        }
    }

    /// The answer as sent.
    func response(_ settings: ProxyConfiguration, provider: String) -> HTTPResponse {
        answer(settings, provider: provider).response
    }
}
