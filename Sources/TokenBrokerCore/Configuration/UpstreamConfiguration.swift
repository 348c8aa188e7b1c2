/// How a source talks to its issuer over HTTP: TLS material and limits. TLS verification is
/// always on; there is no key to turn it off.
///
/// Its keys sit directly in the `source` object of `oauth2` and `http` sources.
public struct UpstreamConfiguration: Sendable, Equatable {
    /// A CA bundle in PEM. Default: the system's (`ca-certificates`).
    public var caFile: String?
    /// A client certificate in PEM, for mutual TLS (RFC 8705). Default: none.
    public var clientCertFile: String?
    /// The client certificate's private key in PEM. Default: none.
    public var clientKeyFile: String?
    /// Time allowed to connect, in milliseconds. Default 5000; 100–60000.
    public var connectTimeoutMsec: Int = 5000
    /// Time allowed for the whole exchange, in milliseconds. Default 10000; 100–120000.
    public var timeoutMsec: Int = 10_000
    /// Longest answer body read, in bytes; a longer one is a `bad_response`. Default 1048576; 1024–16777216.
    public var maxResponseBytes: Int = 1 << 20

    /// The largest `caFile` read: 4 MiB, well above a full system bundle (about 200 KiB).
    public static let caFileLimit = 4 << 20
    /// The largest `clientCertFile` or `clientKeyFile` read: 1 MiB, as for every key file.
    public static let clientFileLimit = 1 << 20

    public init() {}

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        caFile = try reader.string("caFile")
        clientCertFile = try reader.string("clientCertFile")
        clientKeyFile = try reader.string("clientKeyFile")
        connectTimeoutMsec = try reader.int("connectTimeoutMsec", 100...60_000, default: connectTimeoutMsec)
        timeoutMsec = try reader.int("timeoutMsec", 100...120_000, default: timeoutMsec)
        maxResponseBytes = try reader.int("maxResponseBytes", 1024...16_777_216, default: maxResponseBytes)
        if (clientCertFile == nil) != (clientKeyFile == nil) {
            throw ConfigurationError(
                key: reader.keyPath("clientKeyFile"),
                "clientCertFile and clientKeyFile go together; allowed: both or neither")
        }
    }

    /// `text` (a URL or an address as configured) quoted for a message, without what may hold a
    /// credential: the query and fragment (`?api_key=…`, `#sig=…`) become `?...`, and what comes
    /// before the last `@` after the scheme (`user:password@`, a password holding `/` included)
    /// becomes `...@`. For every configuration message that quotes a URL or address it refuses.
    static func shown(_ text: String) -> String {
        let bytes = Array(text.utf8)
        let end = bytes.firstIndex { $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") } ?? bytes.count
        // After `://` when there is one: the scheme's own colon is no password.
        var start = 0
        if end >= 3,
            let colon = (0...(end - 3)).first(where: {
                bytes[$0] == 0x3A && bytes[$0 + 1] == 0x2F && bytes[$0 + 2] == 0x2F
            })
        {
            start = colon + 3
        }
        var kept = Array(bytes[0..<start])
        if let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")) {
            kept += Array("...@".utf8) + bytes[(at + 1)..<end]
        } else {
            kept += bytes[start..<end]
        }
        if end < bytes.count { kept += Array("?...".utf8) }
        return JSONText.quoted(String(decoding: kept, as: UTF8.self))
    }

    /// Checks that a URL is http or https, with a host, a port in range if any, and no user
    /// information: a `user:password@` would be sent to the issuer as Basic credentials by
    /// libcurl beside the source's own, and shown wherever the URL is (the message here does not
    /// repeat it). A host or port libcurl cannot use is refused here, not at every fetch.
    static func checkURL(_ url: String, key: String) throws(ConfigurationError) {
        let lower = url.lowercased()
        guard lower.hasPrefix("https://") || lower.hasPrefix("http://"),
            // Byte by byte: as Characters, "\r\n" is one that equals neither "\r" nor "\n".
            !url.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }),
            url.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false).count >= 3,
            !url.split(separator: "/", omittingEmptySubsequences: false)[2].isEmpty
        else {
            throw ConfigurationError(
                key: key, "\(shown(url)) is not a URL; allowed: an http:// or https:// URL")
        }
        let rest = url.drop { $0 != "/" }.dropFirst(2)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        // An `@` past the authority too: a password holding `/`, `?` or `#` ends the authority
        // early (`user:pa/ss@host`), which is then no host and port either.
        guard !authority.contains("@"), URLAuthority.isHostAndPort(authority) || !rest.contains("@") else {
            throw ConfigurationError(
                key: key,
                "has user information (user:password@ before the host), not shown here; allowed: an http:// or https:// URL without it (credentials go in the source's own keys)"
            )
        }
        // A template's placeholder there is refused where placeholders are read, with its own reason.
        guard URLAuthority.isHostAndPort(authority) || authority.contains("{{") else {
            throw ConfigurationError(
                key: key,
                "\(shown(url)) has no host and port libcurl could use; allowed: HOST or HOST:PORT (a name, an IPv4 address or a bracketed IPv6 one; PORT 1-65535)"
            )
        }
    }
}
