import TokenBrokerCore
import TokenBrokerCrypto

/// The store's key, read from `keyFile`: 32 random bytes, as the file holds them or as 64
/// hexadecimal digits (an ending newline allowed), such as `openssl rand 32 > key` or
/// `openssl rand -hex 32 > key` write.
public enum StoreKeyFile {
    /// The cipher of the key in the file at `path`, or why the file holds no key.
    public static func read(_ path: String) -> Result<AESGCM, StoreRecordProblem> {
        let bytes: [UInt8]
        switch FileContents.read(path, limit: 1024) {
        case .success(let read): bytes = read
        case .failure(let error): return .failure(.init("cannot read \(path): \(error)"))
        }
        return key(from: bytes).map { .success($0) }
            ?? .failure(
                .init(
                    "\(path) holds no key; allowed: 32 bytes, or 64 hexadecimal digits (openssl rand -hex 32)"))
    }

    /// A digest of the key in the file at `path` (not of the file: the same key written as bytes or
    /// as digits is the same key), or nil when the file holds none: what a reload compares, since
    /// the store keeps the key it opened with until a restart.
    public static func digest(_ path: String) -> [UInt8]? {
        guard case .success(let bytes) = FileContents.read(path, limit: 1024), let key = keyBytes(from: bytes) else {
            return nil
        }
        return try? Crypto.sha256(key)
    }

    /// The cipher of the key in `bytes`, or nil when they hold none.
    static func key(from bytes: [UInt8]) -> AESGCM? { keyBytes(from: bytes).flatMap { AESGCM(key: $0) } }

    /// The key in `bytes`, or nil when they hold none.
    private static func keyBytes(from bytes: [UInt8]) -> [UInt8]? {
        if bytes.count == AESGCM.keyLength { return bytes }
        var digits = bytes[...]
        if digits.last == UInt8(ascii: "\n") { digits = digits.dropLast() }
        if digits.last == UInt8(ascii: "\r") { digits = digits.dropLast() }
        guard digits.count == 2 * AESGCM.keyLength else { return nil }
        var key: [UInt8] = []
        key.reserveCapacity(AESGCM.keyLength)
        var index = digits.startIndex
        while index < digits.endIndex {
            guard let high = digits[index].hexDigitValue, let low = digits[index + 1].hexDigitValue else { return nil }
            key.append(high << 4 | low)
            index += 2
        }
        return key
    }
}
