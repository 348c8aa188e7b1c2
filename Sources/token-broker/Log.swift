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
    static func warning(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        emit("warn", message, fields)
    }
    static func error(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        emit("error", message, fields)
    }

    /// One line, newline included: the time, the level, the message, then the fields in order.
    static func line(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String>, at time: WallTime)
        -> String
    {
        var line = "time=\(RFC3339.string(from: time)) level=\(level) msg=\(quote(message))"
        for (key, value) in fields { line += " \(key)=\(quote(value))" }
        line += "\n"
        return line
    }

    /// A value as logfmt reads it: bare when it is printable ASCII with no space, `"` or `=`,
    /// else a JSON string (so a newline or a quote in a value cannot forge a line or a field).
    static func quote(_ value: String) -> String {
        let plain =
            !value.isEmpty
            && value.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F && $0 != "\"" && $0 != "=" }
        return plain ? value : JSONText.quoted(value)
    }

    private static func emit(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String>) {
        // One write(2) per line, so lines from different threads never interleave.
        var bytes = Array(line(level, message, fields, at: WallTime()).utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress! + offset, $0.count - offset) }
            if written <= 0 { break }
            offset += written
        }
    }
}
