import TokenBrokerCore
import TokenBrokerAPI
import TokenBrokerServer
import TokenBrokerUpstream

/// Proxy mode: `ANY /proxy/{name}/{path}` forwarded to the proxy's target with a provider's token
/// added, and sent once more with a refreshed token when the answer says the token was refused.
///
/// The token listener has already checked the path, the request guard and the caller. Here: the
/// body's size and whether it is read whole (so the request can be sent again) or streamed; then
/// one `ProxyExchange` per request.
public final class ProxyAPI: ProxyHandling {
    public typealias Provider = TokenProvider<ContinuousClock>

    struct Route: Sendable {
        let configuration: ProxyConfiguration
        let provider: Provider
    }

    let routes: [String: Route]
    let metrics: BrokerMetrics
    /// The token listener's count of `/proxy/{name}` answers.
    let requestCounter: RequestCounter
    let maxWait: Duration
    /// `Authorization` carries caller keys for the broker itself: it never goes upstream.
    let callerKeysInAuthorization: Bool

    public init(proxies: [ProxyConfiguration], providers: [Provider], maxWait: Duration, callerKeysInAuthorization: Bool, metrics: BrokerMetrics) {
        var routes: [String: Route] = [:]
        for proxy in proxies {
            let provider = providers.first { $0.name == proxy.provider } ?? providers[0]
            routes[proxy.name] = Route(configuration: proxy, provider: provider)
        }
        self.routes = routes
        self.maxWait = maxWait
        self.callerKeysInAuthorization = callerKeysInAuthorization
        self.metrics = metrics
        requestCounter = metrics.counter(listener: "token", route: "/proxy/{name}")
    }

    public func provider(ofProxy name: String) -> String? { routes[name]?.provider.name }

    /// Methods forwarded; TRACE (which echoes credentials back) and CONNECT (a tunnel) are not.
    static let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    public func begin(_ request: HTTPRequest, target: ProxyPath.Target) -> BodyHandling {
        guard let route = routes[target.proxy] else { return .buffer(limit: nil) }
        let settings = route.configuration
        guard Self.methods.contains(request.method) else {
            metrics.recordProxied(proxy: settings.name, status: 405)
            requestCounter.record(status: 405)
            return .refuse(.error(
                405, "method_not_allowed", "\(String(request.method.prefix(32))) is not forwarded; allowed: \(Self.methods.joined(separator: ", "))",
                headers: [("Allow", Self.methods.joined(separator: ", "))]))
        }
        // The server has refused every Transfer-Encoding but exactly `chunked` (RequestHead).
        let chunked = request.header("Transfer-Encoding") != nil
        let length = request.header("Content-Length").flatMap { Int($0) }
        if let length, length > settings.maxBodyBytes {
            metrics.recordProxied(proxy: settings.name, status: 413)
            return .refuse(Self.tooLarge(settings))
        }
        if chunked || (length ?? 0) > settings.bufferBodyBytes {
            return .stream(HTTPRequestBodyStream(limit: settings.maxBodyBytes))
        }
        return .buffer(limit: settings.bufferBodyBytes)
    }

    public func handle(_ request: HTTPRequest, target: ProxyPath.Target) -> HTTPReply {
        guard let route = routes[target.proxy] else {
            return .response(.error(404, "unknown_proxy", "no proxy is named \(JSONText.quoted(target.proxy))"))
        }
        let settings = route.configuration
        if request.bodyTooLarge {
            metrics.recordProxied(proxy: settings.name, status: 413)
            return .response(Self.tooLarge(settings))
        }
        // The request is valid only now: copy what the exchange needs.
        var headers = request.headers
        let hasBody = request.bodyStream != nil || !request.body.isEmpty
        if hasBody, !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
            headers.append(("Content-Type", ""))  // an empty value tells libcurl not to add its own
        }
        if !headers.contains(where: { $0.0.lowercased() == "accept" }) { headers.append(("Accept", "")) }
        let exchange = ProxyExchange(
            api: self, route: route, method: request.method, url: settings.target.url(path: target.path, query: target.query),
            headers: headers, body: request.bodyStream.map { .streamed($0, length: request.header("Content-Length").flatMap { Int($0) }) }
                ?? .buffered(request.body))
        return .deferred { responder in exchange.start(responder) }
    }

    static func tooLarge(_ settings: ProxyConfiguration) -> HTTPResponse {
        .error(413, "payload_too_large", "proxy \(JSONText.quoted(settings.name)) accepts bodies up to \(settings.maxBodyBytes) bytes")
    }
}
