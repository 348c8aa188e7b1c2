import TokenBrokerCore
import TokenBrokerAPI
import TokenBrokerServer
import TokenBrokerUpstream

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

    /// The answer's status.
    var status: Int {
        switch self {
        case .methodNotAllowed: 405
        case .bodyTooLarge: 413
        case .tokenNotCookieSafe, .upstreamUnreachable: 502
        case .upstreamTimeout: 504
        }
    }

    /// The `error` code of the JSON body.
    var code: String {
        switch self {
        case .methodNotAllowed: "method_not_allowed"
        case .bodyTooLarge: "payload_too_large"
        case .tokenNotCookieSafe: "token_not_cookie_safe"
        case .upstreamTimeout: "upstream_timeout"
        case .upstreamUnreachable: "upstream_unreachable"
        }
    }

    /// Headers besides the JSON body's own: `Allow` with 405.
    var headers: [(String, String)] {
        if case .methodNotAllowed = self { return [("Allow", Self.allowed)] }
        return []
    }

    /// The `error_description` for a request to proxy `settings`, whose token comes from `provider`.
    func message(_ settings: ProxyConfiguration, provider: String) -> String {
        let proxy = JSONText.quoted(settings.name)
        switch self {
        case .methodNotAllowed(let method):
            return "\(String(method.prefix(32))) is not forwarded; allowed: \(Self.allowed)"
        case .bodyTooLarge:
            return "proxy \(proxy) accepts bodies up to \(settings.maxBodyBytes) bytes"
        case .tokenNotCookieSafe:
            return "proxy \(proxy): the token of provider \(JSONText.quoted(provider)) holds a character a cookie value cannot (RFC 6265), so it is not sent"
        case .upstreamTimeout:
            return "proxy \(proxy): the target did not answer within \(settings.upstream.timeoutMsec) ms"
        case .upstreamUnreachable(let detail):
            return "proxy \(proxy): \(detail)"
        }
    }

    /// The answer for a request to proxy `settings`, whose token comes from provider `provider`.
    func response(_ settings: ProxyConfiguration, provider: String) -> HTTPResponse {
        .error(status, code, message(settings, provider: provider), headers: headers)
    }

    private static var allowed: String { ProxyAPI.methods.joined(separator: ", ") }
}
