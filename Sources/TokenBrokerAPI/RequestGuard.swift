/// The token routes' guard against browsers and naive SSRF, the lesson of cloud metadata servers.
///
/// A request must carry `Token-Broker-Request: true`, which a browser cannot add to a simple
/// cross-site request and a URL-fetching bug cannot add at all; and it must not carry
/// `X-Forwarded-For`, which marks a request relayed by a proxy. Operators can turn it off with
/// `"requestGuard": false`.
import TokenBrokerServer

enum RequestGuard {
    static let headerName = "Token-Broker-Request"

    private static let missing = HTTPResponse.error(
        403, "missing_request_header", "token routes need the request header \"\(headerName): true\"")
    private static let forwarded = HTTPResponse.error(
        403, "forwarded_request", "requests relayed by a proxy (with X-Forwarded-For) are refused")

    /// Nil when the request may pass, else the 403 to send.
    static func check(_ request: HTTPRequest) -> HTTPResponse? {
        if request.header("X-Forwarded-For") != nil { return forwarded }
        guard request.header(headerName) == "true" else { return missing }
        return nil
    }
}
