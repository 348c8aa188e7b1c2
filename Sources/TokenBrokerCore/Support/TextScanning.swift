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
    /// Whether this is an ASCII decimal digit, `0-9` (RFC 5234's `DIGIT`).
    @inlinable public var isASCIIDigit: Bool { self >= UInt8(ascii: "0") && self <= UInt8(ascii: "9") }

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
    ///
    /// A secret is found however its writer dressed it: ASCII letters in either case; any of its
    /// scalars percent-encoded (its UTF-8 bytes as `%HH`, hex digits in either case), or a space
    /// as `+`, as form encoding and RFC 3986 write them, in whatever mix (`a b/c` as `a+b%2Fc`,
    /// `a%20b/c` or `a%20b%2fc`: an issuer may echo the request's form, or encode the secret
    /// again); and with any scalar that is not visible ASCII (a space, a control character, a
    /// zero-width or other format character, a combining mark: what a caller's filter would drop
    /// or replace) inside it. Such a scalar cannot split a secret so that the text, once
    /// filtered, shows it whole; the span from the secret's first scalar to its last becomes
    /// `[hidden]`.
    public func hiding(_ secrets: [String]) -> String {
        let needles = secrets.filter { !$0.isEmpty }.map { Array($0.unicodeScalars) }.sorted { $0.count > $1.count }
        guard !needles.isEmpty else { return self }
        let scalars = Array(unicodeScalars)
        var kept = String.UnicodeScalarView()
        var index = 0
        while index < scalars.count {
            if let end = needles.lazy.compactMap({ Self.match($0, in: scalars, at: index) }).first {
                kept.append(contentsOf: "[hidden]".unicodeScalars)
                index = end
            } else {
                kept.append(scalars[index])
                index += 1
            }
        }
        return String(kept)
    }

    /// Where `needle` ends when it stands at `start` of `text` (see `hiding(_:)`), or nil.
    private static func match(_ needle: [Unicode.Scalar], in text: [Unicode.Scalar], at start: Int) -> Int? {
        var position = start
        var matched = 0
        while matched < needle.count, position < text.count {
            let scalar = text[position]
            if sameIgnoringASCIICase(scalar, needle[matched]) {
                matched += 1
                position += 1
            } else if let end = encoded(needle[matched], in: text, at: position) {
                matched += 1
                position = end
            } else if matched == 0 || (0x21...0x7E).contains(scalar.value) {
                return nil
            } else {
                position += 1
            }
        }
        return matched == needle.count ? position : nil
    }

    /// Where `scalar` ends when it stands encoded at `start` of `text`: its UTF-8 bytes each as
    /// `%HH` (hex in either case), or `+` for a space; nil otherwise.
    private static func encoded(_ scalar: Unicode.Scalar, in text: [Unicode.Scalar], at start: Int) -> Int? {
        if scalar == " ", text[start] == "+" { return start + 1 }
        func hex(_ scalar: Unicode.Scalar) -> UInt8? { scalar.isASCII ? UInt8(scalar.value).hexDigitValue : nil }
        var position = start
        for byte in String(scalar).utf8 {
            guard position + 2 < text.count, text[position] == "%", let high = hex(text[position + 1]),
                let low = hex(text[position + 2]), high << 4 | low == byte
            else { return nil }
            position += 3
        }
        return position
    }

    private static func sameIgnoringASCIICase(_ a: Unicode.Scalar, _ b: Unicode.Scalar) -> Bool {
        func folded(_ scalar: Unicode.Scalar) -> UInt32 {
            (0x41...0x5A).contains(scalar.value) ? scalar.value + 0x20 : scalar.value
        }
        return folded(a) == folded(b)
    }
}
