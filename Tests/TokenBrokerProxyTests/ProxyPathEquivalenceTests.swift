// The proxy's request-target parser reads bytes; the character-based parser it replaced is kept
// here as the reference, and every target built from the tricky pieces below must get the same
// answer from both: the same target, or the same refusal.
import Testing
import TokenBrokerAPI
import TokenBrokerCore

@testable import TokenBrokerProxy

@Suite struct ProxyPathEquivalenceTests {
    /// Path segments: dot segments in every spelling, encoded separators and controls in both
    /// cases, other escapes, bad escapes, characters outside the allowed set, non-ASCII text
    /// (a combining mark among them), and the empty segment.
    private static let segments = [
        "", ".", "..", "...", "%2e", "%2E", "%2e%2e", ".%2E", "%2E.", "%2e%2e%2e", "a", "A.b", "%41", "%2f", "%2F",
        "%5c", "%5C", "%00", "%0a", "%0D", "%0", "%zz", "%", "a%2", "b c", "é", "\u{301}", "x\u{301}", "~!$&'()*+,;=:@",
    ]

    /// What comes before the path: the proxy prefix with a name, without one, and other starts.
    private static let starts = [
        "/proxy/api", "/proxy/", "/proxy", "/proxyx/api", "http://h/proxy/api", "", "/\u{301}proxy/api",
        "/proxy/a%2fb", "/proxy/api?",
    ]

    private static let queries: [String?] = [nil, "", "x=1&y=%2F", "a/../b", "é", "%zz"]

    @Test func everyTargetOfTheseGetsTheSameAnswerAsFromTheCharacterParser() {
        var targets = 0
        var accepted = 0
        for start in Self.starts {
            for first in Self.segments {
                for second in Self.segments {
                    for query in Self.queries {
                        for separator in ["/", "//"] {
                            let raw = start + separator + first + "/" + second + (query.map { "?" + $0 } ?? "")
                            let answer = ProxyPath.parse(raw)
                            #expect(answer == Self.reference(raw), "\(raw.debugDescription)")
                            targets += 1
                            if case .success = answer { accepted += 1 }
                        }
                    }
                }
            }
        }
        for raw in ["", "/", "?", "/proxy/api", "/proxy/api/", "/proxy/api?x", "/proxy//a", "/proxy/api/a/"] {
            #expect(ProxyPath.parse(raw) == Self.reference(raw), "\(raw.debugDescription)")
        }
        // Both answers are well represented: the comparison is not of refusals alone.
        #expect(targets > 90_000 && accepted > 6_000 && targets - accepted > 10_000)
    }

    /// The parser as it was, reading the target as characters.
    private static func reference(_ raw: String) -> Result<ProxyRequestTarget, ProxyPathProblem> {
        let prefix = "/proxy/"
        guard raw.hasPrefix("/") else { return .failure(.absoluteForm) }
        guard raw.hasPrefix(prefix) else { return .failure(.notUnderProxy) }
        // The character checks, unchanged by the rewrite, are the parser's own.
        guard raw.utf8.allSatisfy(ProxyPath.isAllowed), ProxyPath.wellFormedEscapes(Array(raw.utf8)) else {
            return .failure(.badCharacters)
        }
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
        let last = segments.last
        let directory = below.hasSuffix("/") || last == "." || last == ".."
        var path = "/" + resolved.joined(separator: "/")
        if directory, !resolved.isEmpty { path += "/" }
        return .success(ProxyRequestTarget(proxy: String(name), path: path, query: query))
    }
}
