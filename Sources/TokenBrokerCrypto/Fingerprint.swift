import TokenBrokerCore

/// A short SHA-256 fingerprint of a secret, safe to log: `sha256:1a2b3c4d5e6f`.
///
/// Logs name tokens and keys by this, never by value.
public enum Fingerprint {
    /// `sha256:` and the first six bytes of the secret's SHA-256 in hex; `sha256:unavailable` when it cannot be hashed.
    public static func of(_ secret: String) -> String {
        // A log line must not fail for want of a hash; it then names no fingerprint, and never the secret.
        guard let digest = try? Crypto.sha256(Array(secret.utf8)) else { return "sha256:unavailable" }
        return "sha256:"
            + digest.prefix(6).map { byte in
                let hex = String(byte, radix: 16)
                return byte < 16 ? "0" + hex : hex
            }.joined()
    }
}
