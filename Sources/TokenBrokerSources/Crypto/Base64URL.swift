/// Base64url without padding (RFC 4648 §5), as JOSE uses it.
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var iterator = bytes.makeIterator()
        while let first = iterator.next() {
            let second = iterator.next()
            let third = iterator.next()
            let group = UInt32(first) << 16 | UInt32(second ?? 0) << 8 | UInt32(third ?? 0)
            out.append(alphabet[Int(group >> 18 & 63)])
            out.append(alphabet[Int(group >> 12 & 63)])
            if second != nil { out.append(alphabet[Int(group >> 6 & 63)]) }
            if third != nil { out.append(alphabet[Int(group & 63)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func encode(_ text: String) -> String { encode(Array(text.utf8)) }

    /// Decodes base64url, with or without padding; nil for anything else.
    ///
    /// - Parameter skippingOthers: skip every byte outside the alphabet instead of failing, as
    ///   lenient readers do (Python's `base64.urlsafe_b64decode`, Node's `Buffer.from(_, "base64url")`):
    ///   for telling what such a reader would take a text for, never for reading it.
    public static func decode(_ text: some StringProtocol, skippingOthers: Bool = false) -> [UInt8]? {
        var out: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for byte in text.utf8 {
            let value: UInt8
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = byte - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = byte - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = byte - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"), UInt8(ascii: "+"): value = 62
            case UInt8(ascii: "_"), UInt8(ascii: "/"): value = 63
            case UInt8(ascii: "="): continue
            default:
                if skippingOthers { continue }
                return nil
            }
            buffer = buffer << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(buffer >> UInt32(bits) & 0xFF))
            }
        }
        return out
    }
}
