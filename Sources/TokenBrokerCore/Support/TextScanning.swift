/// Small text helpers that Foundation would otherwise provide.
extension StringProtocol {
    /// The text without leading and trailing characters from `set`, such as `" \t"`.
    public func trimmingCharacters(in set: String) -> String {
        var scalars = Substring(self)
        while let first = scalars.first, set.contains(first) { scalars.removeFirst() }
        while let last = scalars.last, set.contains(last) { scalars.removeLast() }
        return String(scalars)
    }
}

extension StringProtocol {
    /// Where `target` first occurs, compared byte for byte in UTF-8, as protocol text wants. The
    /// standard library's own search (`firstRange(of:)`, `contains(_:)` with a string) lives in
    /// _StringProcessing, which would link the regex engine into the binary: about 0.9 MB of code.
    public func firstRange(ofBytes target: String) -> Range<Index>? {
        let needle = Array(target.utf8)
        let bytes = utf8
        guard let first = needle.first else { return startIndex..<startIndex }
        var start = bytes.startIndex
        while let found = bytes[start...].firstIndex(of: first) {
            var end = found
            var matched = 0
            while matched < needle.count, end < bytes.endIndex, bytes[end] == needle[matched] {
                bytes.formIndex(after: &end)
                matched += 1
            }
            if matched == needle.count { return found..<end }
            start = bytes.index(after: found)
        }
        return nil
    }

    /// Whether `target` occurs, byte for byte (see `firstRange(ofBytes:)`).
    public func contains(bytes target: String) -> Bool { firstRange(ofBytes: target) != nil }
}

extension UInt8 {
    /// The value of an ASCII hex digit (`0-9`, `a-f`, `A-F`), or nil.
    public var hexDigitValue: UInt8? {
        switch self {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): self - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): self - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): self - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
