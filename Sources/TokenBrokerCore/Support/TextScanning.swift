/// Small text helpers that Foundation would otherwise provide.
extension StringProtocol {
    /// The text without the leading and trailing characters for which `isTrimmed` holds: the one
    /// trimmer, which the two below name for their common uses.
    public func trimming(while isTrimmed: (Character) -> Bool) -> String {
        var characters = Substring(self)
        while let first = characters.first, isTrimmed(first) { characters.removeFirst() }
        while let last = characters.last, isTrimmed(last) { characters.removeLast() }
        return String(characters)
    }

    /// The text without leading and trailing characters from `set`, such as `" \t"`.
    public func trimmingCharacters(in set: String) -> String { trimming { set.contains($0) } }

    /// The text without leading and trailing white space in Unicode's sense, line ends included.
    public func trimmingWhitespace() -> String { trimming { $0.isWhitespace } }
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

extension String {
    /// The text with each of `secrets` replaced by `[hidden]`, for text that someone else wrote
    /// and that may repeat what was sent to them (an issuer's error, a server's answer): one pass
    /// over the text, the longest secret first where two start at the same place, and what is
    /// put in never searched again.
    public func hiding(_ secrets: [String]) -> String {
        let needles = secrets.filter { !$0.isEmpty }.map { Array($0.utf8) }.sorted { $0.count > $1.count }
        guard !needles.isEmpty else { return self }
        let bytes = Array(utf8)
        var kept: [UInt8] = []
        kept.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            if let needle = needles.first(where: { bytes[index...].starts(with: $0) }) {
                kept += "[hidden]".utf8
                index += needle.count
            } else {
                kept.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: kept, as: UTF8.self)
    }
}
