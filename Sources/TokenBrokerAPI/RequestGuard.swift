import TokenBrokerServer

/// The token routes' guard against browsers and naive SSRF, the lesson of cloud metadata servers.
///
/// A request must carry `Token-Broker-Request: true`, which a browser cannot add to a simple
/// cross-site request and a URL-fetching bug cannot add at all; and it must not carry
/// `X-Forwarded-For`, which marks a request relayed by a proxy. Operators can turn it off with
/// `"requestGuard": false`.
enum RequestGuard {
    static let headerName = "Token-Broker-Request"

    /// Nil when the request may pass, else the 403 to send.
    static func check(_ request: HTTPRequest) -> ErrorAnswer? {
        if request.header("X-Forwarded-For") != nil { return .forwardedRequest }
        guard request.header(headerName) == "true" else { return .missingRequestHeader }
        return nil
    }
}
