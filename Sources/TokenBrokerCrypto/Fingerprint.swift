import TokenBrokerCore

/// A short SHA-256 fingerprint of a secret, safe to log: `sha256:1a2b3c4d5e6f`.
///
/// Logs name tokens and keys by this, never by value.
public enum Fingerprint {
    /// `sha256:` and the first six bytes of the secret's SHA-256 in hex; `sha256:unavailable` when it cannot be hashed.
    public static func of(_ secret: String) -> String {
        // A log line must not fail for want of a hash; it then names no fingerprint, and never the secret.
        guard let digest = try? Crypto.sha256(Array(secret.utf8)) else { return "sha256:unavailable" }
        return "sha256:" + hex(digest.prefix(6))
    }

    /// The SHA-256 of `text` in lowercase hex, all 64 digits, to name a file or a record by.
    /// - Throws: `internalError` when OpenSSL cannot compute it.
    public static func sha256Hex(_ text: String) throws(TokenFetchError) -> String {
        hex(try Crypto.sha256(Array(text.utf8)))
    }

    /// `bytes` in lowercase hex, two digits each.
    public static func hex(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}
