import TokenBrokerCore

/// Which headers cross the proxy, and how the token is put in (Alamofire's RequestAdapter).
///
/// Hop-by-hop headers (RFC 9110 §7.6.1) and those the `Connection` header names stay behind in
/// both directions. Toward the upstream, `Host` and the body's framing are set by the client
/// library from the target and the body; the broker's own headers (`Token-Broker-Request`, and
/// `Authorization` when it carries a caller key) never leave.
///
/// Values are the bytes as they came, in both directions: one that is not UTF-8 (obs-text,
/// RFC 9110 §5.5) crosses unchanged, where a string would have replaced its bytes with U+FFFD.
/// Names are tokens, ASCII: the server refuses any other in a request, and does not send any
/// other in an answer (`HTTPResponse`).
public enum ProxyHeaders {
    /// A header: its name, and its value as the bytes sent.
    public typealias Field = (String, [UInt8])

    static let hopByHop = [
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "transfer-encoding", "upgrade",
    ]

    /// The request headers to send upstream, with the token put in as `injection` says.
    ///
    /// - Parameters:
    ///   - callerKeyInAuthorization: `Authorization` holds the caller's key for the broker: drop it.
    ///   - cookieName: the provider's cookie name, for `.cookie`.
    public static func forward(
        _ headers: [Field], token: String, injection: ProxyConfiguration.Injection, overwrite: Bool,
        cookieName: String, callerKeyInAuthorization: Bool
    ) -> [Field] {
        let named = namedByConnection(headers)
        var out = headers.filter { header in
            let name = header.0
            return !isListed(name, hopByHop) && !isListed(name, notForwarded) && !isListed(name, named)
                && !isProxyHeader(name)
        }
        if callerKeyInAuthorization { out.removeAll(named: "Authorization") }
        switch injection {
        case .authorization:
            var value = Array("Bearer ".utf8)
            value.append(contentsOf: token.utf8)
            put(&out, name: "Authorization", value: value, overwrite: overwrite)
        case .header(let name):
            put(&out, name: name, value: Array(token.utf8), overwrite: overwrite)
        case .cookie:
            putCookie(&out, name: cookieName, value: token, overwrite: overwrite)
        }
        return out
    }

    /// The answer's headers to pass back to the client. `Content-Length` and `Date` are left to
    /// the broker's server, which sets them for what it actually sends; `Proxy` and `Proxy-*`
    /// (`Proxy-Status`, `Proxy-Authentication-Info`) speak of the upstream's own proxies, not of
    /// the broker, and stay behind as they do toward the upstream.
    public static func back(_ headers: [Field]) -> [Field] {
        let named = namedByConnection(headers)
        return headers.filter { header in
            !isListed(header.0, hopByHop) && !isListed(header.0, notReturned) && !isListed(header.0, named)
                && !isProxyHeader(header.0)
        }
    }

    /// Set by the client library toward the upstream, or the broker's own.
    private static let notForwarded = ["host", "content-length", "expect", "token-broker-request"]
    /// Set by the broker's server for what it actually sends.
    private static let notReturned = ["content-length", "date"]

    /// Whether `name` is one of `list` (each in lowercase), ASCII letters compared without regard
    /// to case, in place and lengths first: every header of every proxied request and answer
    /// comes through here.
    private static func isListed(_ name: String, _ list: [String]) -> Bool {
        let count = name.utf8.count
        for listed in list where listed.utf8.count == count && name.equalsIgnoringASCIICase(listed) { return true }
        return false
    }

    /// `Proxy` and `Proxy-*` are meant for the broker as a proxy, never for the target; `Proxy`
    /// in particular becomes `HTTP_PROXY` in CGI-style servers (httpoxy, CVE-2016-5385).
    static func isProxyHeader(_ name: String) -> Bool {
        let bytes = name.utf8
        guard bytes.count >= 5, bytes.prefix(5).elementsEqual("proxy".utf8, by: { $0.asciiLowercased == $1 }) else {
            return false
        }
        return bytes.count == 5 || bytes.dropFirst(5).first == UInt8(ascii: "-")
    }

    /// Every name listed in `Connection` (lower case) that is not already hop-by-hop; usually
    /// none, and then nothing is built: upstreams send `Connection: keep-alive` with every answer.
    /// An option with a byte beyond ASCII is no token, so it names no header, and is passed over.
    private static func namedByConnection(_ headers: [Field]) -> [String] {
        var names: [String] = []
        for (name, value) in headers where name.equalsIgnoringASCIICase("Connection") {
            value.withUnsafeBufferPointer { bytes in
                var start = 0
                while start < bytes.count {
                    let end = bytes[start...].firstIndex(of: UInt8(ascii: ",")) ?? bytes.count
                    defer { start = end + 1 }
                    let option = UnsafeBufferPointer(rebasing: bytes[bytes.trimmingHTTPBlanks(start..<end)])
                    guard !option.isEmpty, option.allSatisfy({ $0 < 0x80 }) else { continue }
                    let alreadyDropped = hopByHop.contains { listed in
                        listed.utf8.count == option.count
                            && listed.utf8.elementsEqual(option) { $0 == $1.asciiLowercased }
                    }
                    if !alreadyDropped { names.append(String(decoding: option.map(\.asciiLowercased), as: UTF8.self)) }
                }
            }
        }
        return names
    }

    private static func put(_ headers: inout [Field], name: String, value: [UInt8], overwrite: Bool) {
        if headers.contains(named: name) {
            guard overwrite else { return }
            headers.removeAll(named: name)
        }
        headers.append((name, value))
    }

    /// Puts `name=value` into the request's `Cookie` header. A token that is not a cookie value
    /// (`TokenRules.isCookieValue`) is never put in: `tok;admin=1` would add a cookie of its
    /// own. The proxy refuses such a token before it gets here (502 `token_not_cookie_safe`).
    /// The caller's other cookies keep their bytes. Several `Cookie` headers from the caller
    /// become one (RFC 6265 §5.4 allows one), their cookies in order, so that a cookie of the
    /// token's name is found, and replaced, in whichever of them it came.
    private static func putCookie(_ headers: inout [Field], name: String, value: String, overwrite: Bool) {
        guard TokenRules.isCookieValue(value) else { return }
        var pair = Array(name.utf8)
        pair.append(UInt8(ascii: "="))
        let prefix = pair.count
        pair.append(contentsOf: value.utf8)
        guard let index = headers.firstIndex(where: { $0.0.equalsIgnoringASCIICase("Cookie") }) else {
            headers.append(("Cookie", pair))
            return
        }
        var pairs: [ArraySlice<UInt8>] = []
        for header in headers[index...] where header.0.equalsIgnoringASCIICase("Cookie") {
            pairs += header.1.split(separator: UInt8(ascii: ";")).map { $0.trimmingHTTPBlanks() }.filter { !$0.isEmpty }
        }
        let named = { (cookie: ArraySlice<UInt8>) in cookie.starts(with: pair[..<prefix]) }
        switch pairs.firstIndex(where: named) {
        case .some where !overwrite: return
        case .some(let at):
            // The caller's cookie of that name, however often sent, is the token's once.
            pairs[at] = pair[...]
            var kept = pairs[...at]
            kept += pairs[(at + 1)...].filter { !named($0) }
            pairs = Array(kept)
        case .none: pairs.append(pair[...])
        }
        headers[index].1 = Array(pairs.joined(separator: Array("; ".utf8)))
        var position = index + 1
        while position < headers.count {
            if headers[position].0.equalsIgnoringASCIICase("Cookie") {
                headers.remove(at: position)
            } else {
                position += 1
            }
        }
    }
}
