internal import COpenSSL

/// Hashes, MACs, random bytes and constant-time comparison from OpenSSL's libcrypto.
public enum Crypto {
    /// SHA-256 of `bytes`.
    public static func sha256(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let input = Array(bytes)
        _ = input.withUnsafeBufferPointer { input in
            EVP_Digest(input.baseAddress, input.count, &digest, &length, EVP_sha256(), nil)
        }
        return digest
    }

    /// HMAC-SHA-256 of `message` under `key`.
    public static func hmacSHA256(key: [UInt8], message: some Collection<UInt8>) -> [UInt8] {
        var mac = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let input = Array(message)
        _ = key.withUnsafeBufferPointer { key in
            input.withUnsafeBufferPointer { input in
                HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), input.baseAddress, input.count, &mac, &length)
            }
        }
        return mac
    }

    /// `count` bytes from OpenSSL's CSPRNG.
    public static func randomBytes(_ count: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&bytes, Int32(count)) == 1 else {
            fatalError("OpenSSL's random generator failed; refusing to mint predictable values")
        }
        return bytes
    }

    /// Compares two byte strings in time that depends only on their length (`CRYPTO_memcmp`).
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return CRYPTO_memcmp(a, b, a.count) == 0
    }

    /// The last OpenSSL error as text, and clears the queue.
    static func lastError() -> String {
        let code = ERR_get_error()
        ERR_clear_error()
        guard code != 0 else { return "unknown OpenSSL error" }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// A short SHA-256 fingerprint of a secret, safe to log: `sha256:1a2b3c4d5e6f`.
///
/// Logs name tokens and keys by this, never by value.
public enum Fingerprint {
    public static func of(_ secret: String) -> String {
        let digest = Crypto.sha256(Array(secret.utf8))
        return "sha256:" + digest.prefix(6).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}
