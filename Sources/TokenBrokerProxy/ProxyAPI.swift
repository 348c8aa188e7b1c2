import TokenBrokerAPI
import TokenBrokerCore
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
    /// Each client connection's memory (`connectionMemoryKiB`), where libmicrohttpd keeps the
    /// request's head and builds the answer's.
    let connectionMemory: Int

    /// - Parameter connectionMemory: bytes, `connectionMemoryKiB` × 1024; default 4 KiB.
    public init(
        proxies: [ProxyConfiguration], providers: [Provider], maxWait: Duration, callerKeysInAuthorization: Bool,
        metrics: BrokerMetrics, connectionMemory: Int = 4 * 1024
    ) {
        self.connectionMemory = connectionMemory
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

    public func target(_ rawTarget: String) -> Result<ProxyRequestTarget, ProxyPathProblem> {
        ProxyPath.parse(rawTarget)
    }

    public func provider(ofProxy name: String) -> String? { routes[name]?.provider.name }

    /// The listener answers a name without a route (`404 unknown_proxy`) before it calls `begin` or
    /// `handle`, since `provider(ofProxy:)` said nil: this bare 404 is never sent, and the error
    /// answer exists once, with the listener.
    /// The token listener answers a name without a proxy before asking here; should one arrive, it gets that answer.
    private static func noRoute(_ name: String) -> HTTPResponse { ErrorAnswer.unknownProxy(name: name).response }

    /// Bytes of header lines (`name: value` and its line end) an answer to `request` may pass
    /// on: libmicrohttpd builds the answer's head in what the connection's memory has left
    /// beside the request's head (its bytes, and a record of about 56 bytes per header), and
    /// closes the connection without a byte when it does not fit. `answerHeadReserve` covers the
    /// status line and the server's own headers (`Date`, `Content-Length`, `Connection`) with a
    /// margin: measured with libmicrohttpd 0.9.75, a 4 KiB connection with an 83-byte request
    /// head of 3 headers took 3,609 bytes of header lines and not 3,709; this allows 3,590.
    ///
    /// libmicrohttpd keeps such a record for each query argument and each cookie too, and a copy
    /// of each `Cookie` value, all in the same memory: 40 arguments or cookies took 2 KiB.
    func answerHeadRoom(_ request: HTTPRequest, headers: [ProxyHeaders.Field]) -> Int {
        let requestLine = request.method.utf8.count + (request.rawTarget ?? request.path).utf8.count + 11
        let requestHead = headers.reduce(requestLine + 2) { $0 + $1.0.utf8.count + $1.1.count + 4 }
        var cookies = 0
        var cookieCopies = 0
        for (name, value) in headers where name.equalsIgnoringASCIICase("cookie") {
            cookies += 1 + value.reduce(0) { $0 + ($1 == UInt8(ascii: ";") ? 1 : 0) }
            cookieCopies += value.count + 1
        }
        let records = headers.count + request.query.count + cookies
        return connectionMemory - requestHead - 56 * records - cookieCopies - Self.answerHeadReserve
    }

    /// What `answerHeadRoom` keeps back for the status line, the server's own headers and a margin.
    static let answerHeadReserve = 256

    /// Methods forwarded; TRACE (which echoes credentials back) and CONNECT (a tunnel) are not.
    static let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    public func begin(_ request: HTTPRequest, target: ProxyRequestTarget) -> BodyHandling {
        guard let route = routes[target.proxy] else { return .refuse(Self.noRoute(target.proxy)) }
        let settings = route.configuration
        guard Self.methods.contains(request.method) else {
            return .refuse(
                counted(
                    ProxyFailure.methodNotAllowed(request.method).response(settings, provider: route.provider.name),
                    proxy: settings.name))
        }
        // RFC 9110 §7.6.2: each intermediary checks an OPTIONS request's Max-Forwards: one that
        // is not a number is refused here; at 0, `handle` answers as the final recipient (after
        // the body, so that the connection is kept), and above it counts one hop off.
        if request.method == "OPTIONS", Self.maxForwards(request.headers) == .malformed {
            return .refuse(
                counted(ErrorAnswer.malformedHead(problem: Self.malformedMaxForwards).response, proxy: settings.name))
        }
        // The server has refused every Transfer-Encoding but exactly `chunked` (RequestHead).
        let chunked = request.header("Transfer-Encoding") != nil
        let length = request.header("Content-Length").flatMap { Int($0) }
        if let length, length > settings.maxBodyBytes {
            return .refuse(
                counted(
                    ProxyFailure.bodyTooLarge.response(settings, provider: route.provider.name), proxy: settings.name))
        }
        if chunked || (length ?? 0) > settings.bufferBodyBytes {
            return .stream(HTTPRequestBodyStream(limit: settings.maxBodyBytes))
        }
        return .buffer(limit: settings.bufferBodyBytes)
    }

    /// An answer of the proxy's own, given before any exchange with its target, counted as an
    /// exchange's answer is: by proxy, and among the token listener's requests.
    private func counted(_ response: HTTPResponse, proxy: String) -> HTTPResponse {
        metrics.recordProxied(proxy: proxy, status: response.status)
        requestCounter.record(status: response.status)
        return response
    }

    /// An OPTIONS request's `Max-Forwards` (RFC 9110 §7.6.2: one whole number).
    enum MaxForwards: Equatable {
        case absent
        /// Saturated at `mostHops`, the most this intermediary supports.
        case hops(Int)
        /// Not digits alone, or given twice: which value counts is not known, so none does.
        case malformed
    }

    static let mostHops = 1_000_000
    static let malformedMaxForwards = "Max-Forwards must be given once, as a whole number (RFC 9110 §7.6.2)"

    static func maxForwards(_ headers: HTTPFields) -> MaxForwards {
        var found: Int?
        for index in 0..<headers.count where headers.name(at: index).equalsIgnoringASCIICase("Max-Forwards") {
            guard found == nil, let value = headers.value(at: index), !value.isEmpty else { return .malformed }
            var hops = 0
            for byte in value.utf8 {
                guard byte.isASCIIDigit else { return .malformed }
                hops = min(Self.mostHops, hops * 10 + Int(byte - UInt8(ascii: "0")))
            }
            found = hops
        }
        return found.map { .hops($0) } ?? .absent
    }

    /// What the broker adds to every request it forwards, as an HTTP-to-HTTP gateway must
    /// (RFC 9110 §7.6.3): the version it received, as the client's request line said it (a
    /// client's `HTTP/1.2` is served as 1.1, RFC 9110 §2.5, but is named as sent: Via records
    /// what each sender advertised), and its name.
    static func via(_ request: HTTPRequest) -> ProxyHeaders.Field {
        var value = Array("1.1 token-broker".utf8)
        value[2] = UInt8(ascii: "0") + min(request.minorVersion, 9)
        return ("Via", value)
    }

    public func handle(_ request: HTTPRequest, target: ProxyRequestTarget, caller: CallerRecheck?) -> HTTPReply {
        guard let route = routes[target.proxy] else { return .response(Self.noRoute(target.proxy)) }
        let settings = route.configuration
        if request.bodyTooLarge {
            return .response(
                counted(
                    ProxyFailure.bodyTooLarge.response(settings, provider: route.provider.name), proxy: settings.name))
        }
        // The request is valid only now: copy what the exchange needs.
        // Values as the bytes sent: one that is not UTF-8 goes on as it came (`ProxyHeaders`).
        var headers = (0..<request.headers.count).map { index in
            (request.headers.name(at: index), request.headers.withValue(at: index) { $0.map(Array.init) ?? [] })
        }
        // OPTIONS with no hop left is answered here; with some, one hop fewer goes on (`begin`
        // refused a bad one).
        if request.method == "OPTIONS", case .hops(let hops) = Self.maxForwards(request.headers) {
            guard hops > 0 else {
                return .response(
                    counted(
                        HTTPResponse(
                            status: 200, body: [],
                            headers: [("Allow", Self.methods.joined(separator: ", ")), ("Cache-Control", "no-store")]),
                        proxy: settings.name))
            }
            for index in headers.indices where headers[index].0.equalsIgnoringASCIICase("Max-Forwards") {
                headers[index].1 = Array(String(hops - 1).utf8)
            }
        }
        let exchange = ProxyExchange(
            api: self, route: route, method: request.method,
            url: settings.target.url(path: target.path, query: target.query),
            headers: headers,
            body: request.bodyStream.map { .streamed($0, length: request.header("Content-Length").flatMap { Int($0) }) }
                ?? .buffered(request.body),
            answerHeadRoom: answerHeadRoom(request, headers: headers), via: Self.via(request), caller: caller)
        return .deferred { responder in exchange.start(responder) }
    }
}
