import TokenBrokerAPI
import TokenBrokerCore

/// The rules that keep `/proxy/{name}/{path}` from becoming an open proxy, applied to the request
/// target exactly as the client sent it (not percent-decoded).
///
/// - Only origin-form targets (`/…`); an absolute URL is refused.
/// - Only characters RFC 3986 allows in a path or query; no raw controls, spaces, or bytes above
///   ASCII. Percent-escapes must be well formed.
/// - Dot segments (`.`, `..`, also written `%2e`) are resolved as RFC 3986 §5.2.4 says; a path
///   that climbs above the proxy's root is refused. A segment with an encoded slash or
///   backslash (`%2f`, `%5c`) or an encoded NUL, CR or LF is refused too, so that no upstream
///   can be tricked into seeing a different path than the broker checked.
public enum ProxyPath {
    public static let prefix = "/proxy/"

    /// Splits and checks `/proxy/{name}/{path}?{query}`.
    public static func parse(_ raw: String) -> Result<ProxyRequestTarget, ProxyPathProblem> {
        guard raw.hasPrefix("/") else { return .failure(.absoluteForm) }
        guard raw.hasPrefix(prefix) else { return .failure(.notUnderProxy) }
        guard raw.utf8.allSatisfy(isAllowed), wellFormedEscapes(raw) else { return .failure(.badCharacters) }
        let rest = raw.dropFirst(prefix.count)
        let pathPart = rest.prefix { $0 != "?" }
        let query = pathPart.count < rest.count ? String(rest.dropFirst(pathPart.count + 1)) : nil
        let name = pathPart.prefix { $0 != "/" }
        guard !name.isEmpty else { return .failure(.notUnderProxy) }
        let below = String(pathPart.dropFirst(name.count))
        guard let segments = PathSegments.of(below) else { return .failure(.encodedSeparator) }
        var resolved: [Substring] = []
        for segment in segments {
            switch segment {
            case ".": continue
            case "..":
                guard !resolved.isEmpty else { return .failure(.escapesRoot) }
                resolved.removeLast()
            default: resolved.append(segment)
            }
        }
        // A trailing "/", "." or ".." keeps the path a directory, as RFC 3986 resolution does.
        let last = segments.last
        let directory = below.hasSuffix("/") || last == "." || last == ".."
        var path = "/" + resolved.joined(separator: "/")
        if directory, !resolved.isEmpty { path += "/" }
        return .success(ProxyRequestTarget(proxy: String(name), path: path, query: query))
    }

    /// RFC 3986 `pchar`, "/", "?" and "%": unreserved, sub-delims, ":" and "@".
    private static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): true
        case UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"), UInt8(ascii: "'"), UInt8(ascii: "("),
            UInt8(ascii: ")"),
            UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: ","), UInt8(ascii: ";"), UInt8(ascii: "="):
            true
        case UInt8(ascii: ":"), UInt8(ascii: "@"), UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "%"): true
        default: false
        }
    }

    private static func wellFormedEscapes(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%") {
                guard index + 2 < bytes.count, bytes[index + 1].hexDigitValue != nil,
                    bytes[index + 2].hexDigitValue != nil
                else { return false }
                index += 3
            } else {
                index += 1
            }
        }
        return true
    }
}
