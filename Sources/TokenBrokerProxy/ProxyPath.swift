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
/// - A dot segment with parameters (`..;x`, `.;`, in any spelling, `;` also as `%3b`) is refused:
///   Tomcat and servers like it drop a segment's parameters before they resolve dot segments,
///   and would climb where the broker saw an ordinary segment.
public enum ProxyPath {
    public static let prefix = "/proxy/"

    /// Splits and checks `/proxy/{name}/{path}?{query}`.
    public static func parse(_ raw: String) -> Result<ProxyRequestTarget, ProxyPathProblem> {
        guard raw.utf8.allSatisfy(isAllowed) else {
            // The same refusals, in the same order, as for a target of allowed characters.
            guard raw.hasPrefix("/") else { return .failure(.absoluteForm) }
            guard raw.hasPrefix(prefix) else { return .failure(.notUnderProxy) }
            return .failure(.badCharacters)
        }
        // Every byte is now one of the ASCII characters allowed, each a character of its own:
        // the target is read as bytes, which every proxied request is (reading it as characters
        // cost more than the rest of the broker's work on the request).
        let bytes = Array(raw.utf8)
        guard bytes.first == UInt8(ascii: "/") else { return .failure(.absoluteForm) }
        guard bytes.starts(with: prefix.utf8) else { return .failure(.notUnderProxy) }
        guard wellFormedEscapes(bytes) else { return .failure(.badCharacters) }
        let rest = bytes[prefix.utf8.count...]
        let pathEnd = rest.firstIndex(of: UInt8(ascii: "?")) ?? rest.endIndex
        let query = pathEnd < rest.endIndex ? text(rest[(pathEnd + 1)...]) : nil
        let pathPart = rest[..<pathEnd]
        let nameEnd = pathPart.firstIndex(of: UInt8(ascii: "/")) ?? pathPart.endIndex
        guard nameEnd > pathPart.startIndex else { return .failure(.notUnderProxy) }
        let below = pathPart[nameEnd...]
        guard let segments = segments(of: below) else { return .failure(.encodedSeparator) }
        var resolved: [Segment] = []
        for segment in segments {
            switch segment {
            case .dot: continue
            case .dotWithParameters: return .failure(.dotSegmentWithParameters)
            case .dotDot:
                guard !resolved.isEmpty else { return .failure(.escapesRoot) }
                resolved.removeLast()
            case .other: resolved.append(segment)
            }
        }
        // A trailing "/", "." or ".." keeps the path a directory, as RFC 3986 resolution does.
        let directory =
            below.last == UInt8(ascii: "/") || segments.last.map { $0 == .dot || $0 == .dotDot } == true
        var path: [UInt8] = [UInt8(ascii: "/")]
        path.reserveCapacity(below.count + 1)
        for (index, segment) in resolved.enumerated() {
            if index > 0 { path.append(UInt8(ascii: "/")) }
            if case .other(let range) = segment { path += bytes[range] }
        }
        if directory, !resolved.isEmpty { path.append(UInt8(ascii: "/")) }
        return .success(
            ProxyRequestTarget(proxy: text(pathPart[..<nameEnd]), path: text(path[...]), query: query))
    }

    /// One segment of the path below the proxy's name.
    private enum Segment: Equatable {
        /// `.`, also written `%2e`.
        case dot
        /// `..`, also written with `%2e` for either dot.
        case dotDot
        /// `.` or `..` followed by parameters (`;…`, the `;` also written `%3b`).
        case dotWithParameters
        /// Any other, as sent: its bytes' range in the target.
        case other(Range<Int>)
    }

    /// The segments of `path` (empty, or starting with "/"), as `PathSegments.of` finds them,
    /// read as bytes; nil when one holds an encoded slash, backslash, NUL, CR or LF. The escapes
    /// are well formed, so that each "%" starts one.
    private static func segments(of path: ArraySlice<UInt8>) -> [Segment]? {
        guard !path.isEmpty else { return [] }
        var out: [Segment] = []
        var start = path.startIndex + 1
        while true {
            let end = path[start...].firstIndex(of: UInt8(ascii: "/")) ?? path.endIndex
            guard let segment = segment(path, start..<end) else { return nil }
            out.append(segment)
            guard end < path.endIndex else { break }
            start = end + 1
        }
        // "/a/" splits into ["a", ""]: the empty last segment only marks the trailing slash.
        if out.last == .other(path.endIndex..<path.endIndex) { out.removeLast() }
        return out
    }

    private static func segment(_ path: ArraySlice<UInt8>, _ range: Range<Int>) -> Segment? {
        var dots = 0
        var onlyDots = true
        // Whether the dots so far are followed by parameters: a `;` (or `%3b`) after them.
        var parameters = false
        var index = range.lowerBound
        while index < range.upperBound {
            if path[index] == UInt8(ascii: "%") {
                let escape = (path[index + 1], path[index + 2].asciiLowercased)
                switch escape {
                case (UInt8(ascii: "2"), UInt8(ascii: "f")), (UInt8(ascii: "5"), UInt8(ascii: "c")),
                    (UInt8(ascii: "0"), UInt8(ascii: "0")), (UInt8(ascii: "0"), UInt8(ascii: "a")),
                    (UInt8(ascii: "0"), UInt8(ascii: "d")):
                    return nil
                case (UInt8(ascii: "2"), UInt8(ascii: "e")) where !parameters: dots += 1
                case (UInt8(ascii: "3"), UInt8(ascii: "b")) where onlyDots: parameters = true
                case _ where parameters: break
                default: onlyDots = false
                }
                index += 3
            } else {
                if !parameters {
                    if path[index] == UInt8(ascii: ".") {
                        dots += 1
                    } else if path[index] == UInt8(ascii: ";"), onlyDots {
                        parameters = true
                    } else {
                        onlyDots = false
                    }
                }
                index += 1
            }
        }
        guard onlyDots else { return .other(range) }
        switch dots {
        case 1 where parameters, 2 where parameters: return .dotWithParameters
        case 1: return .dot
        case 2: return .dotDot
        default: return .other(range)
        }
    }

    private static func text(_ bytes: ArraySlice<UInt8>) -> String { String(decoding: bytes, as: UTF8.self) }

    /// RFC 3986 `pchar`, "/", "?" and "%": unreserved, sub-delims, ":" and "@".
    static func isAllowed(_ byte: UInt8) -> Bool {
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

    static func wellFormedEscapes(_ bytes: [UInt8]) -> Bool {
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
