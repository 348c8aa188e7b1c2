/// The segments of a URL path, read the way proxy mode and a proxy's base URL must agree on:
/// `%2e` is a dot, and a segment that hides a separator or a control character in a
/// percent-escape makes the whole path unreadable.
public enum PathSegments {
    /// The segments of a path (which starts with "/" or is empty), with `%2e` read as "."; nil
    /// when a segment hides a separator or a control character in a percent-escape.
    public static func of(_ path: String) -> [Substring]? {
        guard !path.isEmpty else { return [] }
        var out: [Substring] = []
        for segment in path.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let lower = segment.lowercased()
            for forbidden in ["%2f", "%5c", "%00", "%0a", "%0d"] where lower.contains(bytes: forbidden) { return nil }
            let dots = lower.replacingAll("%2e", with: ".")
            out.append(dots == "." || dots == ".." ? Substring(dots) : segment)
        }
        // "/a/" splits into ["a", ""]: the empty last segment only marks the trailing slash.
        if out.last?.isEmpty == true { out.removeLast() }
        return out
    }
}

extension String {
    fileprivate func replacingAll(_ target: String, with replacement: String) -> String {
        var out = ""
        var rest = Substring(self)
        while let range = rest.firstRange(ofBytes: target) {
            out += rest[..<range.lowerBound] + replacement
            rest = rest[range.upperBound...]
        }
        return out + rest
    }
}
