/// Where a listener binds: an IPv4 or IPv6 literal and a port (0 picks a free one).
///
/// Written `127.0.0.1:8080`, `0.0.0.0:8080` or `[::1]:8080`. Host names are refused, so that a
/// listener never binds somewhere a resolver chose.
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    public var isIPv6: Bool

    public init(parsing text: String) throws(ConfigurationError) {
        let problem = ConfigurationError(
            key: "", "\"\(text)\" is not a listen address; write IPv4:PORT or [IPv6]:PORT, such as 127.0.0.1:8080 or [::1]:8080")
        let host: Substring, portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else { throw problem }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
            isIPv6 = true
            guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else { throw problem }
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw problem }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            isIPv6 = false
            let parts = host.split(separator: ".", omittingEmptySubsequences: false)
            guard parts.count == 4, parts.allSatisfy({ UInt8($0) != nil && ($0 == "0" || !$0.hasPrefix("0")) }) else { throw problem }
        }
        guard let port = UInt16(portText) else { throw problem }
        self.host = String(host)
        self.port = port
    }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// Whether the address is on this machine only.
    public var isLoopback: Bool { isIPv6 ? host == "::1" : host.hasPrefix("127.") }
}
