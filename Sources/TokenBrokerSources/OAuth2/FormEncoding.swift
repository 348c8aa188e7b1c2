/// `application/x-www-form-urlencoded`, as OAuth 2.0 uses it (RFC 6749 Appendix B).
enum FormEncoding {
    static func encode(_ pairs: [(String, String)]) -> String {
        pairs.map { escape($0.0) + "=" + escape($0.1) }.joined(separator: "&")
    }

    /// Percent-encodes all but unreserved characters; a space becomes `+`.
    static func escape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: " "):
                out += "+"
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out += "%" + (byte < 16 ? "0" : "") + hex
            }
        }
        return out
    }
}
