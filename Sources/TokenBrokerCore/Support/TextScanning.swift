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
    /// again), or escaped twice (`a%2Bb%252Fc`: the request's form, encoded again); and with any
    /// scalar that is not visible ASCII (a space, a control character, a zero-width or other
    /// format character, a combining mark: what a caller's filter would drop or replace) inside
    /// it. Such a scalar cannot split a secret so that the text, once filtered, shows it whole;
    /// the span from the secret's first scalar to its last becomes `[hidden]`.
    public func hiding(_ secrets: [String]) -> String {
        let needles = secrets.filter { !$0.isEmpty }.map { Array($0.unicodeScalars) }.sorted { $0.count > $1.count }
        guard !needles.isEmpty else { return self }
        let scalars = Array(unicodeScalars)
        var kept = String.UnicodeScalarView()
        var walk = Walk()
        var index = 0
        while index < scalars.count {
            if let end = needles.lazy.compactMap({ Self.match($0, in: scalars, at: index, &walk) }).first {
                kept.append(contentsOf: "[hidden]".unicodeScalars)
                index = end
            } else {
                kept.append(scalars[index])
                index += 1
            }
        }
        return String(kept)
    }

    /// The states of `match(_:in:at:_:)`'s walk, kept from one place of the text to the next so
    /// that each walk does not allocate its own.
    private struct Walk {
        var pending: [(matched: Int, position: Int)] = []
        var visited = Set<Int>()
    }

    /// Where `needle` ends when it stands at `start` of `text` (see `hiding(_:)`), or nil.
    ///
    /// A walk over every way the text may spell the needle, since a step can often be taken in
    /// two (a `%` of the text is the needle's own `%`, or opens an escape of it; a space of the
    /// text is the needle's space, or one put inside it): each (scalars matched, position) pair
    /// is visited once, and the walk ends at the first visible ASCII scalar that no way takes.
    private static func match(_ needle: [Unicode.Scalar], in text: [Unicode.Scalar], at start: Int, _ walk: inout Walk)
        -> Int?
    {
        // Most places start nothing, and are told apart before the walk.
        guard let first = needle.first, start < text.count,
            sameIgnoringASCIICase(text[start], first) || startsEncoded(first, in: text, at: start)
        else { return nil }
        defer {
            walk.pending.removeAll(keepingCapacity: true)
            walk.visited.removeAll(keepingCapacity: walk.visited.capacity <= 256)
        }
        walk.pending.append((0, start))
        var end: Int?
        while let (matched, position) = walk.pending.popLast() {
            if matched == needle.count {
                end = Swift.max(end ?? position, position)
                continue
            }
            guard position < text.count, walk.visited.insert(matched &* (text.count + 1) &+ position).inserted else {
                continue
            }
            let scalar = text[position]
            if sameIgnoringASCIICase(scalar, needle[matched]) { walk.pending.append((matched + 1, position + 1)) }
            forEachEncodedEnd(needle[matched], in: text, at: position) { walk.pending.append((matched + 1, $0)) }
            if matched > 0, !(0x21...0x7E).contains(scalar.value) { walk.pending.append((matched, position + 1)) }
        }
        return end
    }

    /// Whether `scalar` may stand encoded at `start` of `text`, by its first byte.
    private static func startsEncoded(_ scalar: Unicode.Scalar, in text: [Unicode.Scalar], at start: Int) -> Bool {
        if scalar == " ", text[start] == "+" || escaped(UInt8(ascii: "+"), in: text, at: start, twice: false) {
            return true
        }
        guard let byte = scalar.utf8.first else { return false }
        return escaped(byte, in: text, at: start, twice: false) || escaped(byte, in: text, at: start, twice: true)
    }

    /// Calls `body` with each place where `scalar` may end when it stands encoded at `start` of
    /// `text`: its UTF-8 bytes each as `%HH` (hex in either case), or encoded once more as
    /// `%25HH` (a request's form echoed percent-encoded again); a space as `+`, or `%2B`.
    private static func forEachEncodedEnd(
        _ scalar: Unicode.Scalar, in text: [Unicode.Scalar], at start: Int, _ body: (Int) -> Void
    ) {
        if scalar == " " {
            if text[start] == "+" { return body(start + 1) }
            if escaped(UInt8(ascii: "+"), in: text, at: start, twice: false) { return body(start + 3) }
        }
        let bytes = scalar.utf8
        func step(_ index: Unicode.Scalar.UTF8View.Index, _ position: Int) {
            guard index < bytes.endIndex else { return body(position) }
            if escaped(bytes[index], in: text, at: position, twice: false) {
                step(bytes.index(after: index), position + 3)
            }
            if escaped(bytes[index], in: text, at: position, twice: true) {
                step(bytes.index(after: index), position + 5)
            }
        }
        step(bytes.startIndex, start)
    }

    /// Whether `byte` stands at `start` of `text` as `%HH`, or with `twice` as `%25HH`.
    private static func escaped(_ byte: UInt8, in text: [Unicode.Scalar], at start: Int, twice: Bool) -> Bool {
        func hex(_ scalar: Unicode.Scalar) -> UInt8? { scalar.isASCII ? UInt8(scalar.value).hexDigitValue : nil }
        let digits = start + (twice ? 3 : 1)
        guard digits + 1 < text.count, text[start] == "%", !twice || (text[start + 1] == "2" && text[start + 2] == "5"),
            let high = hex(text[digits]), let low = hex(text[digits + 1])
        else { return false }
        return high << 4 | low == byte
    }

    private static func sameIgnoringASCIICase(_ a: Unicode.Scalar, _ b: Unicode.Scalar) -> Bool {
        func folded(_ scalar: Unicode.Scalar) -> UInt32 {
            (0x41...0x5A).contains(scalar.value) ? scalar.value + 0x20 : scalar.value
        }
        return folded(a) == folded(b)
    }
}
