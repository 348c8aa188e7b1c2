internal import COpenSSL
import TokenBrokerCore

/// Hashes, MACs, random bytes and constant-time comparison from OpenSSL's libcrypto.
///
/// Every call's result is checked: a digest or MAC that OpenSSL did not compute is an error,
/// never the zeros it was initialised with (an HS256 token signed with zeros would verify under
/// nothing, and a caller key hashed to zeros would match nothing by luck only).
public enum Crypto {
    /// SHA-256 of `bytes`.
    /// - Throws: `internalError` when OpenSSL cannot compute it (out of memory, a broken provider).
    public static func sha256(_ bytes: some Collection<UInt8>) throws(TokenFetchError) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let input = Array(bytes)
        let status = input.withUnsafeBufferPointer { input in
            EVP_Digest(input.baseAddress, input.count, &digest, &length, EVP_sha256(), nil)
        }
        guard status == 1, length == 32 else { throw .internalError("SHA-256 failed: \(lastError())") }
        return digest
    }

    /// HMAC-SHA-256 of `message` under `key`.
    /// - Throws: `internalError` when OpenSSL cannot compute it.
    public static func hmacSHA256(key: [UInt8], message: some Collection<UInt8>) throws(TokenFetchError) -> [UInt8] {
        var mac = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let input = Array(message)
        guard let keyLength = Int32(exactly: key.count) else { throw .internalError("HMAC key too long") }
        let result = key.withUnsafeBufferPointer { key in
            input.withUnsafeBufferPointer { input in
                HMAC(EVP_sha256(), key.baseAddress, keyLength, input.baseAddress, input.count, &mac, &length)
            }
        }
        guard result != nil, length == 32 else { throw .internalError("HMAC-SHA-256 failed: \(lastError())") }
        return mac
    }

    /// `count` bytes from OpenSSL's CSPRNG.
    /// - Throws: `internalError` when the generator fails; never predictable bytes instead.
    public static func randomBytes(_ count: Int) throws(TokenFetchError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard let length = Int32(exactly: count), RAND_bytes(&bytes, length) == 1 else {
            throw .internalError("OpenSSL's random generator failed: \(lastError())")
        }
        return bytes
    }

    /// Compares two byte strings in time that depends only on their length (`CRYPTO_memcmp`).
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.withUnsafeBufferPointer { constantTimeEqual($0, b) }
    }

    /// `constantTimeEqual` for bytes read in place, such as a header's value, without a copy.
    public static func constantTimeEqual(_ a: UnsafeBufferPointer<UInt8>, _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        guard let start = a.baseAddress else { return true }  // both empty
        return CRYPTO_memcmp(start, b, a.count) == 0
    }

    /// The last OpenSSL error as text, and clears the queue.
    public static func lastError() -> String {
        let code = ERR_get_error()
        ERR_clear_error()
        guard code != 0 else { return "unknown OpenSSL error" }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
