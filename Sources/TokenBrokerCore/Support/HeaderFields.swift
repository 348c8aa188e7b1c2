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
    /// Whether the text equals `other`, ASCII letters compared without regard to case; for two
    /// strings, lengths are compared first, which settles most look-ups at once.
    public func equalsIgnoringASCIICase(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        // Native strings are contiguous UTF-8: compare the bytes in place (a header look-up runs
        // on every request); others, such as bridged ones, byte by byte through their views.
        let inPlace = utf8.withContiguousStorageIfAvailable { mine in
            other.utf8.withContiguousStorageIfAvailable { theirs in
                zip(mine, theirs).allSatisfy { $0 == $1 || $0.asciiLowercased == $1.asciiLowercased }
            }
        }
        if let inPlace, let equal = inPlace { return equal }
        return utf8.elementsEqual(other.utf8) { $0 == $1 || $0.asciiLowercased == $1.asciiLowercased }
    }
}

extension String {
    /// Whether the text begins with the bytes of `prefix`, compared byte for byte, without the
    /// Unicode equivalence of `hasPrefix`: for the ASCII paths routes are told apart by, on every
    /// request (`hasPrefix` costs several times as much).
    public func hasBytePrefix(_ prefix: String) -> Bool {
        let inPlace = utf8.withContiguousStorageIfAvailable { mine in
            prefix.utf8.withContiguousStorageIfAvailable { theirs in
                guard mine.count >= theirs.count else { return false }
                for index in theirs.indices where mine[index] != theirs[index] { return false }
                return true
            }
        }
        if let inPlace, let starts = inPlace { return starts }
        return utf8.starts(with: prefix.utf8)
    }
}

extension UInt8 {
    /// The byte with an ASCII capital letter made small; any other byte unchanged.
    public var asciiLowercased: UInt8 { self >= 0x41 && self <= 0x5A ? self | 0x20 : self }
}

extension Array where Element == (String, String) {
    /// The value of the first field named `name` (compared without regard to case), or nil.
    public func value(named name: String) -> String? {
        first { $0.0.equalsIgnoringASCIICase(name) }?.1
    }

    /// Whether a field named `name` is present (compared without regard to case).
    public func contains(named name: String) -> Bool {
        contains { $0.0.equalsIgnoringASCIICase(name) }
    }

    /// Removes every field named `name` (compared without regard to case).
    public mutating func removeAll(named name: String) {
        removeAll { $0.0.equalsIgnoringASCIICase(name) }
    }
}
