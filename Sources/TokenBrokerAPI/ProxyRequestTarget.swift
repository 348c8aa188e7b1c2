/// A request target under `/proxy/`, as proxy mode checked it (`TokenBrokerProxy`'s `ProxyPath`):
/// the proxy's name, the normalised path under it (starting with "/"), and the query as sent.
public struct ProxyRequestTarget: Equatable, Sendable {
    public let proxy: String
    public let path: String
    public let query: String?

    public init(proxy: String, path: String, query: String?) {
        self.proxy = proxy
        self.path = path
        self.query = query
    }
}

/// Why a request target under `/proxy/` may not pass; `ErrorAnswer` words each.
public enum ProxyPathProblem: Error, Equatable, Sendable {
    /// An absolute URL rather than a path: the broker is not a forward proxy.
    case absoluteForm
    /// No proxy's name after `/proxy/`.
    case notUnderProxy
    /// A character RFC 3986 does not allow raw, or a bad percent-escape.
    case badCharacters
    /// The path climbs above the proxy's base path.
    case escapesRoot
    /// A segment hides a slash, backslash, NUL, CR or LF in a percent-escape.
    case encodedSeparator
    /// A segment is a dot segment with parameters (`..;x`, `.;`, also with `%2e` or `%3b`):
    /// servers such as Tomcat drop the parameters and read a dot segment the broker did not.
    case dotSegmentWithParameters
}
