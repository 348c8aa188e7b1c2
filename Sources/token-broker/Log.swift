import Glibc
import Synchronization
import TokenBrokerCore
import TokenBrokerCrypto

/// Log lines on stderr, one event a line, in logfmt:
///
///     time=2026-11-29T23:40:00Z level=info msg="token fetched" provider=default version=1 token=sha256:1a2b3c4d5e6f
///
/// or, with `"logFormat": "json"`, one JSON object with the same fields in the same order:
///
///     {"time":"2026-11-29T23:40:00Z","level":"info","msg":"token fetched","provider":"default","version":"1",…}
///
/// At start, the file's `logFormat` applies as soon as the file is parsed as JSON, so that an
/// error in the rest of the file, or in the environment's overrides, is logged as the file asks.
/// Lines written before (an unreadable file, one that is not JSON, a bad command line), those of
/// `--check-config` and those of `healthcheck` are logfmt.
///
/// - Important: never pass a token or a secret; pass `Fingerprint.of(secret)`.
enum Log {
    /// Set once the configuration is read (`use`); read by every line.
    private static let writesJSON = Atomic<Bool>(false)

    /// Writes the lines from now on in `format`.
    static func use(_ format: BrokerConfiguration.LogFormat) {
        writesJSON.store(format == .json, ordering: .relaxed)
    }

    static func info(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) { emit("info", message, fields) }
    static func warning(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        emit("warn", message, fields)
    }
    static func error(_ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        emit("error", message, fields)
    }

    /// One line, newline included: the time, the level, the message, then the fields in order.
    static func line(
        _ level: String, _ message: String, _ fields: KeyValuePairs<String, String>, at time: WallTime,
        format: BrokerConfiguration.LogFormat = .logfmt
    ) -> String {
        switch format {
        case .logfmt:
            var line = "time=\(RFC3339.string(from: time)) level=\(level) msg=\(quote(message))"
            for (key, value) in fields { line += " \(key)=\(quote(value))" }
            line += "\n"
            return line
        case .json:
            // Every value a JSON string. No caller names a field time, level or msg.
            var line = "{\"time\":\"\(RFC3339.string(from: time))\",\"level\":\"\(level)\",\"msg\":"
            line += JSONText.quoted(message)
            for (key, value) in fields { line += ",\(JSONText.quoted(key)):\(JSONText.quoted(value))" }
            line += "}\n"
            return line
        }
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
        let format: BrokerConfiguration.LogFormat = writesJSON.load(ordering: .relaxed) ? .json : .logfmt
        var bytes = Array(line(level, message, fields, at: WallTime(), format: format).utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress! + offset, $0.count - offset) }
            if written <= 0 { break }
            offset += written
        }
    }
}
