import Glibc

/// Where a listener binds: an IPv4 or IPv6 literal and a port (0 picks a free one), or a Unix
/// domain socket.
///
/// Written `127.0.0.1:8080`, `0.0.0.0:8080`, `[::1]:8080` or `unix:/run/token-broker/token.sock`.
/// Host names are refused, so that a listener never binds somewhere a resolver chose. A Unix
/// socket lets file permissions decide who may connect (see `unixSocketMode`).
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    public var isIPv6: Bool
    /// The socket file's path, for a Unix domain socket; then `host` is empty and `port` 0.
    public var unixPath: String?

    /// The longest socket path Linux accepts (`sun_path` holds 108 bytes with the final NUL).
    public static let maximumUnixPathBytes = 107

    public init(parsing text: String) throws(ConfigurationError) {
        let problem = ConfigurationError(
            key: "",
            "\"\(text)\" is not a listen address; write IPv4:PORT, [IPv6]:PORT or unix:/absolute/path, such as 127.0.0.1:8080, [::1]:8080 or unix:/run/token-broker.sock"
        )
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst("unix:".count))
            guard path.hasPrefix("/"), path.utf8.count <= Self.maximumUnixPathBytes, !path.hasSuffix("/"),
                !path.utf8.contains(0)
            else { throw problem }
            host = ""
            port = 0
            isIPv6 = false
            unixPath = path
            return
        }
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                throw problem
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
            isIPv6 = true
            // The system's own parser decides, so an address accepted here is one the listener can bind.
            var parsed = in6_addr()
            guard !host.isEmpty, !host.contains("%"), inet_pton(AF_INET6, String(host), &parsed) == 1 else {
                throw problem
            }
            // An IPv4-mapped address (`::ffff:a.b.c.d`) cannot be bound by an IPv6-only socket,
            // which every IPv6 listener is: it is refused here, not at start.
            let bytes = withUnsafeBytes(of: parsed) { Array($0) }
            if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF {
                throw ConfigurationError(
                    key: "",
                    "\"\(text)\" is an IPv4 address written as IPv6 (::ffff:…), which an IPv6 listener cannot bind; write it as IPv4:PORT, such as \(bytes[12]).\(bytes[13]).\(bytes[14]).\(bytes[15]):\(portText)"
                )
            }
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw problem }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            isIPv6 = false
            let parts = host.split(separator: ".", omittingEmptySubsequences: false)
            // Digits only: `UInt8` alone would take `+1`, which no listener can bind.
            guard parts.count == 4,
                parts.allSatisfy({ Self.isDigits($0) && UInt8($0) != nil && ($0 == "0" || !$0.hasPrefix("0")) })
            else {
                throw problem
            }
        }
        guard Self.isDigits(portText), let port = UInt16(portText) else { throw problem }
        self.host = String(host)
        self.port = port
        unixPath = nil
    }

    /// Whether `text` is one or more ASCII digits, and nothing else (no sign, no blank).
    private static func isDigits(_ text: Substring) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy(\.isASCIIDigit)
    }

    public var description: String {
        if let unixPath { return "unix:" + unixPath }
        return isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// Whether a listener here and one at `other` cannot both bind: the same socket path, or the
    /// same family and port (not 0, which picks a free one) where the hosts are one address or
    /// either is the family's wildcard. `0.0.0.0` takes its port on every IPv4 address, `::` on
    /// every IPv6 one and no IPv4 address (every IPv6 listener is IPv6-only: `ListeningSocket`).
    /// IPv6 hosts are compared as addresses: `::1` is `0:0:0:0:0:0:0:1`.
    public func overlaps(_ other: ListenAddress) -> Bool {
        if unixPath != nil || other.unixPath != nil { return unixPath == other.unixPath }
        guard isIPv6 == other.isIPv6, port == other.port, port != 0 else { return false }
        guard let mine = hostBytes, let theirs = other.hostBytes else { return host == other.host }
        return mine == theirs || isWildcard || other.isWildcard
    }

    /// Whether the host is the family's wildcard, `0.0.0.0` or `::`, which binds every address.
    public var isWildcard: Bool { unixPath == nil && hostBytes?.allSatisfy { $0 == 0 } == true }

    /// The host as the system reads it, in network order; nil for a Unix socket.
    private var hostBytes: [UInt8]? {
        guard unixPath == nil else { return nil }
        if isIPv6 {
            var address = in6_addr()
            guard inet_pton(AF_INET6, host, &address) == 1 else { return nil }
            return withUnsafeBytes(of: address) { Array($0) }
        }
        var address = in_addr()
        guard inet_pton(AF_INET, host, &address) == 1 else { return nil }
        return withUnsafeBytes(of: address) { Array($0) }
    }

    /// Whether the address is on this machine only (a Unix socket always is).
    public var isLoopback: Bool { unixPath != nil || (isIPv6 ? host == "::1" : host.hasPrefix("127.")) }
}
