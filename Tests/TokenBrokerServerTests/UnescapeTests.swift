import CMicroHTTPD
import Testing

/// The server's percent-decoding (`CMicroHTTPD_unescape`, given to libmicrohttpd for the path
/// and each query name and value) must answer exactly as libmicrohttpd's own `MHD_http_unescape`:
/// it only skips, at memory speed, the part before the first `%`.
@Suite struct UnescapeTests {
    /// What RFC 3986's percent-encoding decodes to, as libmicrohttpd reads it: `%` and two hex
    /// digits are one byte; anything else, a `%` without them included, stays as it is.
    static func reference(_ bytes: [UInt8]) -> [UInt8] {
        func hex(_ byte: UInt8) -> UInt8? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%"), index + 2 < bytes.count, let high = hex(bytes[index + 1]),
                let low = hex(bytes[index + 2])
            {
                out.append(high << 4 | low)
                index += 3
            } else {
                out.append(bytes[index])
                index += 1
            }
        }
        return out
    }

    /// Decodes `bytes` (no NUL among them) in place with `decode`; the bytes up to the returned length.
    static func decoded(_ bytes: [UInt8], _ decode: (UnsafeMutablePointer<CChar>) -> Int) -> [UInt8] {
        var buffer = bytes.map { CChar(bitPattern: $0) } + [0]
        let length = buffer.withUnsafeMutableBufferPointer { decode($0.baseAddress!) }
        return buffer[..<length].map { UInt8(bitPattern: $0) }
    }

    @Test func decodesAsLibmicrohttpdAndTheReferenceOnGeneratedTargets() {
        // Bytes that matter to the decoder: `%`, hex digits of both cases, bytes that are not
        // hex, `+` (decoded elsewhere), and bytes above ASCII.
        let alphabet = Array("%%%2fF0aAgG+/ ?=".utf8) + [0x7F, 0xC3, 0xFF]
        var generator = SplitMix(seed: 0x5EED)
        for round in 0..<20_000 {
            let length = round < 100 ? round % 8 : Int(generator.next() % 40)
            let bytes = (0..<length).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] }
            let ours = Self.decoded(bytes) { CMicroHTTPD_unescape(nil, nil, $0) }
            let library = Self.decoded(bytes) { MHD_http_unescape($0) }
            #expect(ours == library, "\(bytes)")
            #expect(ours == Self.reference(bytes), "\(bytes)")
            if ours != library || ours != Self.reference(bytes) { return }
        }
    }

    @Test(arguments: [
        ("/plain/path", "/plain/path"), ("", ""), ("%", "%"), ("%4", "%4"), ("%41", "A"), ("a%41b%2", "aAb%2"),
        ("%zz%41", "%zzA"), ("x%2F%2f", "x//"), ("%%41", "%A"), ("tail%", "tail%"),
        // A decoded NUL counts in the length: libmicrohttpd keeps a query value by its length.
        ("a%00b", "a\u{0}b"), ("%00", "\u{0}"),
    ])
    func decodesKnownTargets(_ target: String, _ expected: String) {
        #expect(Self.decoded(Array(target.utf8)) { CMicroHTTPD_unescape(nil, nil, $0) } == Array(expected.utf8))
    }
}

/// A small, seeded pseudo-random generator (SplitMix64), so that a failure repeats.
private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
