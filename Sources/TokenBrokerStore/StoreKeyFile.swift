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

    /// The cipher of the key in `bytes`, or nil when they hold none.
    static func key(from bytes: [UInt8]) -> AESGCM? {
        if bytes.count == AESGCM.keyLength { return AESGCM(key: bytes) }
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
        return AESGCM(key: key)
    }
}
