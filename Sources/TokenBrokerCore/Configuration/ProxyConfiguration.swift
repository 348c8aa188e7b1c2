/// One proxy of `proxies`: requests to `/proxy/{name}/{path}` are forwarded to `target` + path
/// with a provider's token added on the way (Alamofire's RequestAdapter), and retried once with
/// a refreshed token when the answer says the token was refused (its RequestRetrier).
public struct ProxyConfiguration: Sendable, Equatable {
    /// Where the token goes.
    public enum Injection: Sendable, Equatable {
        /// `Authorization: Bearer <token>`.
        case authorization
        /// A cookie, named by the provider's `tokenCookieName`.
        case cookie
        /// A header of this name, the bare token as its value.
        case header(String)
    }

    /// `[A-Za-z0-9._-]{1,64}`, unique among proxies.
    public var name: String
    /// The base URL: `http://` or `https://`, a host, an optional base path; no query, fragment or user.
    public var target: ProxyTarget
    /// The provider whose token is added. Default: the first provider.
    public var provider: String?
    /// Default `authorization`; also `cookie` or `header:<name>`.
    public var inject: Injection = .authorization
    /// When the caller already sent the credential `inject` would add: replace it (true, the
    /// default) or pass it through untouched (false).
    public var overwrite = true
    /// Answer statuses that mean "your token was refused": refresh once and retry. Default [401].
    public var retryOn: [Int] = [401]
    /// When set, a status in `retryOn` counts only if the answer also has this header (such as
    /// `x-amzn-waf-action` for WAF challenges).
    public var retryOnHeader: String?
    /// Request bodies up to this are read whole before forwarding, so the request can be retried.
    /// Default 65536; 0–1048576.
    public var bufferBodyBytes = 64 * 1024
    /// Longest request body accepted; longer ones get 413. Default 10485760; 0–1073741824.
    public var maxBodyBytes = 10 * 1024 * 1024
    /// TLS and limits toward the target. `timeoutMsec` (default 30000 here) bounds the whole
    /// exchange, the streamed answer included.
    public var upstream: UpstreamConfiguration

    public init(name: String, target: ProxyTarget, provider: String? = nil) {
        self.name = name
        self.target = target
        self.provider = provider
        upstream = UpstreamConfiguration()
        upstream.timeoutMsec = 30_000
    }

    init(reading value: JSONValue, path: String) throws(ConfigurationError) {
        var reader = try ObjectReader(value, path: path)
        guard let name = try reader.string("name"), Self.isName(name) else {
            throw ConfigurationError(key: reader.keyPath("name"), "is required: 1–64 of A–Z, a–z, 0–9, '.', '_', '-'")
        }
        guard let targetText = try reader.string("target") else {
            throw ConfigurationError(
                key: reader.keyPath("target"), "is required: the base URL, such as https://api.example.com/v1")
        }
        let target: ProxyTarget
        do {
            target = try ProxyTarget(parsing: targetText)
        } catch {
            throw ConfigurationError(key: reader.keyPath("target"), error.message)
        }
        self.init(name: name, target: target, provider: try reader.string("provider"))
        let injection = try reader.string("inject", default: "authorization")
        switch injection {
        case "authorization": inject = .authorization
        case "cookie": inject = .cookie
        case _ where injection.hasPrefix("header:") && Self.isHeaderName(String(injection.dropFirst("header:".count))):
            let header = String(injection.dropFirst("header:".count))
            guard !Self.reservedHeaders.contains(header.lowercased()) else {
                throw ConfigurationError(
                    key: reader.keyPath("inject"),
                    "\"\(header)\" cannot carry the token; allowed: any other header name")
            }
            inject = .header(header)
        default:
            throw ConfigurationError(
                key: reader.keyPath("inject"),
                "unknown value \"\(injection)\"; allowed: authorization, cookie, header:<name>")
        }
        overwrite = try reader.bool("overwrite", default: overwrite)
        if let items = try reader.array("retryOn") {
            retryOn = []
            for item in items {
                guard let status = item.value.exactInt, (100...599).contains(status) else {
                    throw ConfigurationError(key: item.path, "must be an HTTP status code, 100–599")
                }
                retryOn.append(status)
            }
        }
        if let header = try reader.string("retryOnHeader") {
            guard Self.isHeaderName(header) else {
                throw ConfigurationError(key: reader.keyPath("retryOnHeader"), "is not a header name")
            }
            retryOnHeader = header.lowercased()
        }
        bufferBodyBytes = try reader.int("bufferBodyBytes", 0...1_048_576, default: bufferBodyBytes)
        maxBodyBytes = try reader.int("maxBodyBytes", 0...1_073_741_824, default: maxBodyBytes)
        if try reader.raw("maxResponseBytes") != nil {
            throw ConfigurationError(
                key: reader.keyPath("maxResponseBytes"),
                "does not apply to proxies: their answers stream, whatever their size")
        }
        var upstream = try UpstreamConfiguration(reading: &reader)
        // Refused above, though the shared reader reads it: not among the keys allowed.
        reader.disallow("maxResponseBytes")
        if try reader.raw("timeoutMsec") == nil { upstream.timeoutMsec = 30_000 }
        self.upstream = upstream
        try reader.finish()
    }

    /// Headers that belong to the connection or to the broker, never to a token.
    static let reservedHeaders: Set<String> = [
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
        "proxy-authorization", "proxy-authenticate", "expect", "cookie",
    ]

    static func isName(_ name: String) -> Bool {
        (1...64).contains(name.utf8.count)
            && name.utf8.allSatisfy {
                $0 == 0x2E || $0 == 0x5F || $0 == 0x2D || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0)
                    || (0x61...0x7A).contains($0)
            }
    }

    /// An RFC 9110 field name (a token).
    static func isHeaderName(_ name: String) -> Bool { name.utf8.count <= 64 && name.isHTTPToken }
}

/// A proxy's base URL, taken apart once.
public struct ProxyTarget: Sendable, Equatable, CustomStringConvertible {
    /// `http` or `https`.
    public let scheme: String
    /// Host and optional port, as written.
    public let authority: String
    /// The base path without a trailing slash; empty for the root.
    public let basePath: String
    /// Scheme, authority and base path put together, which every proxied request's URL starts with.
    private let base: String

    public init(parsing text: String) throws(ConfigurationError) {
        let problem = ConfigurationError(
            key: "",
            "\(UpstreamConfiguration.shown(text)) is not a base URL; allowed: http:// or https://, a host, an optional path; no query, fragment or user"
        )
        let lower = text.lowercased()
        let scheme: String
        if lower.hasPrefix("https://") {
            scheme = "https"
        } else if lower.hasPrefix("http://") {
            scheme = "http"
        } else {
            throw problem
        }
        let rest = text.dropFirst(scheme.count + 3)
        let authority = rest.prefix { $0 != "/" }
        var path = String(rest.dropFirst(authority.count))
        // A password holding `/` ends the authority early (`user:pa/ss@host`): the message then
        // does not repeat the text.
        guard URLAuthority.isHostAndPort(authority) || !text.contains("@") else {
            throw ConfigurationError(
                key: "",
                "has user information (user:password@ before the host), not shown here; allowed: http:// or https://, a host, an optional path"
            )
        }
        guard URLAuthority.isHostAndPort(authority),
            text.utf8.allSatisfy({
                $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") && $0 != UInt8(ascii: "\\")
            })
        else { throw problem }
        while path.hasSuffix("/") { path.removeLast() }
        guard PathSegments.of(path)?.allSatisfy({ $0 != "." && $0 != ".." }) ?? false else { throw problem }
        self.scheme = scheme
        self.authority = String(authority)
        self.basePath = path
        base = "\(scheme)://\(authority)\(path)"
    }

    public var description: String { base }

    /// The upstream URL for a normalised path (starting with "/") and a query (without "?"), built
    /// in one string of the right size.
    public func url(path: String, query: String?) -> String {
        var url = base
        url.reserveCapacity(base.utf8.count + path.utf8.count + 1 + (query?.utf8.count ?? 0))
        url.append(path)
        if let query {
            url.append("?")
            url.append(query)
        }
        return url
    }
}
