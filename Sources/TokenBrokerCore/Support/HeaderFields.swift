/// HTTP header fields as name and value pairs, looked up by name the way HTTP compares names:
/// ASCII letters without regard to case (RFC 9110, section 5.1), without lowercasing a copy.
extension StringProtocol {
    /// Whether the text equals `other`, ASCII letters compared without regard to case.
    public func equalsIgnoringASCIICase(_ other: some StringProtocol) -> Bool {
        var mine = utf8.makeIterator()
        var theirs = other.utf8.makeIterator()
        while true {
            switch (mine.next(), theirs.next()) {
            case (nil, nil): return true
            case (let a?, let b?) where a == b || a.asciiLowercased == b.asciiLowercased: continue
            default: return false
            }
        }
    }
}

extension String {
    /// Calls `body` with the text's UTF-8, read in place: what every per-request comparison of
    /// headers, paths and query names reads, rather than walking `utf8` a byte at a time. A
    /// native string, as every string the broker makes is, is contiguous and is not copied; any
    /// other is made contiguous first (`withUTF8` on a copy of the value, which costs about a
    /// thousand instructions a compatibility answer more when taken every time).
    public func withUTF8Bytes<Result>(_ body: (UnsafeBufferPointer<UInt8>) throws -> Result) rethrows -> Result {
        if let result = try utf8.withContiguousStorageIfAvailable(body) { return result }
        var text = self
        return try text.withUTF8(body)
    }

    /// Whether the text equals `other`, ASCII letters compared without regard to case; for two
    /// strings, lengths are compared first, which settles most look-ups at once.
    public func equalsIgnoringASCIICase(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        return withUTF8Bytes { mine in
            other.withUTF8Bytes { theirs in
                zip(mine, theirs).allSatisfy { $0 == $1 || $0.asciiLowercased == $1.asciiLowercased }
            }
        }
    }

    /// Whether the text begins with the bytes of `prefix`, compared byte for byte, without the
    /// Unicode equivalence of `hasPrefix`: for the ASCII paths routes are told apart by, on every
    /// request (`hasPrefix` costs several times as much).
    public func hasBytePrefix(_ prefix: String) -> Bool {
        withUTF8Bytes { mine in
            prefix.withUTF8Bytes { theirs in
                guard mine.count >= theirs.count else { return false }
                for index in theirs.indices where mine[index] != theirs[index] { return false }
                return true
            }
        }
    }
}

extension String {
    /// Whether the text is an RFC 9110 token, as every header name is: letters, digits and
    /// `!#$%&'*+-.^_`|~`, at least one.
    public var isHTTPToken: Bool { !isEmpty && utf8.allSatisfy { $0.isHTTPTokenCharacter } }
}

extension UInt8 {
    /// The byte with an ASCII capital letter made small; any other byte unchanged.
    public var asciiLowercased: UInt8 { self >= 0x41 && self <= 0x5A ? self | 0x20 : self }

    /// A space or a tab: what `OWS` (RFC 9110 §5.6.3) is made of, the blanks around a header
    /// value and between list elements, which are not part of them.
    @inlinable @inline(__always) public var isHTTPBlank: Bool { self == 0x20 || self == 0x09 }

    /// `tchar` (RFC 9110 §5.6.2): a character of a header name or a token. The server checks it
    /// on every byte of every request's header names.
    @inlinable @inline(__always) public var isHTTPTokenCharacter: Bool {
        switch self {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default: false
        }
    }
}

extension Array where Element == (String, String) {
    /// The value of the first field named `name` (compared without regard to case), or nil.
    public func value(named name: String) -> String? {
        first { $0.0.equalsIgnoringASCIICase(name) }?.1
    }
}

extension Array {
    /// Whether a field named `name` is present (compared without regard to case); for fields
    /// whose values are text, and for those whose values are the bytes as sent (the proxy's).
    public func contains<Value>(named name: String) -> Bool where Element == (String, Value) {
        contains { $0.0.equalsIgnoringASCIICase(name) }
    }

    /// Removes every field named `name` (compared without regard to case).
    public mutating func removeAll<Value>(named name: String) where Element == (String, Value) {
        removeAll { $0.0.equalsIgnoringASCIICase(name) }
    }
}

extension BidirectionalCollection where Element == UInt8 {
    /// `bounds` without the blanks (`isHTTPBlank`) at either end: a header value, or an element
    /// of a list, without the `OWS` around it (RFC 9110 §5.6.3). Empty when all are blanks.
    @inlinable
    public func trimmingHTTPBlanks(_ bounds: Range<Index>) -> Range<Index> {
        var start = bounds.lowerBound
        var end = bounds.upperBound
        while start < end, self[start].isHTTPBlank { formIndex(after: &start) }
        while end > start, self[index(before: end)].isHTTPBlank { formIndex(before: &end) }
        return start..<end
    }

    /// The bytes without the blanks at either end.
    @inlinable
    public func trimmingHTTPBlanks() -> SubSequence { self[trimmingHTTPBlanks(startIndex..<endIndex)] }
}
