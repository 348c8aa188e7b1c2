/// `application/x-www-form-urlencoded`, as OAuth 2.0 uses it (RFC 6749 Appendix B), and the
/// percent-encoding of URL parts that it is built on (RFC 3986 §2.1).
enum FormEncoding {
    static func encode(_ pairs: [(String, String)]) -> String {
        pairs.map { escape($0.0) + "=" + escape($0.1) }.joined(separator: "&")
    }

    /// Percent-encodes all but unreserved characters; a space becomes `+`.
    static func escape(_ text: String) -> String { percentEncoded(text, spaceAsPlus: true) }

    /// Percent-encodes all but RFC 3986's unreserved characters (`A–Z a–z 0–9 - . _ ~`), a space
    /// as `%20`: the value then stays one piece of a URL's path, query or fragment.
    static func percentEncoded(_ text: String) -> String { percentEncoded(text, spaceAsPlus: false) }

    private static func percentEncoded(_ text: String, spaceAsPlus: Bool) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: " ") where spaceAsPlus:
                out += "+"
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out += "%" + (byte < 16 ? "0" : "") + hex
            }
        }
        return out
    }
}
