import Glibc
import TokenBrokerCore
import TokenBrokerCrypto

/// Log lines on stderr, one event a line, in logfmt:
///
///     time=2026-11-29T23:40:00Z level=info msg="token fetched" provider=default version=1 token=sha256:1a2b3c4d5e6f
///
/// - Important: never pass a token or a secret; pass `Fingerprint.of(secret)`.
enum Log {
    static func info(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) { emit("info", message, fields) }
    static func warning(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) { emit("warn", message, fields) }
    static func error(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) { emit("error", message, fields) }

    private static func emit(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String>) {
        var line = "time=\(RFC3339.string(from: WallTime())) level=\(level) msg=\(quote(message))"
        for (key, value) in fields { line += " \(key)=\(quote(value))" }
        line += "\n"
        // One write(2) per line, so lines from different threads never interleave.
        var bytes = Array(line.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress! + offset, $0.count - offset) }
            if written <= 0 { break }
            offset += written
        }
    }

    private static func quote(_ value: String) -> String {
        let plain = !value.isEmpty && value.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F && $0 != "\"" && $0 != "=" }
        return plain ? value : JSONText.quoted(value)
    }
}
