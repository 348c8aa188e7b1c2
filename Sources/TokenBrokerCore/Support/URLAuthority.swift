/// The authority of an `http://` or `https://` URL as the broker takes it: `HOST[:PORT]` and
/// nothing more, checked before libcurl reads it its own way.
public enum URLAuthority {
    /// Whether `authority` is `HOST[:PORT]`: HOST a name (`_` allowed, as container platforms
    /// give them: Compose services), an IPv4 address or an IPv6 one in brackets, PORT 1 to
    /// 65535. A user-info part, an empty or non-numeric port, or any other byte is refused.
    public static func isHostAndPort(_ authority: Substring) -> Bool {
        var host = authority
        // A port, unless the last colon is inside an IPv6 address's brackets.
        if let colon = authority.lastIndex(of: ":"), !authority[colon...].contains("]") {
            let port = authority[authority.index(after: colon)...]
            guard (1...5).contains(port.utf8.count), port.utf8.allSatisfy(\.isASCIIDigit),
                let number = Int(port), (1...65_535).contains(number)
            else { return false }
            host = authority[..<colon]
        }
        if host.hasPrefix("[") {
            guard host.hasSuffix("]"), host.count > 2 else { return false }
            return host.dropFirst().dropLast().utf8.allSatisfy {
                $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") || $0.hexDigitValue != nil
            }
        }
        return !host.isEmpty
            && host.utf8.allSatisfy {
                $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0.isASCIIDigit
                    || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0)
            }
    }
}
