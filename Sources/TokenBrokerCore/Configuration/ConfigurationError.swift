/// A configuration problem, naming the key and what it allows.
///
/// Printed as `providers[0].maxRetryCount: 11 is out of range; allowed: 0–10`.
public struct ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Where the problem is, as a path such as `providers[0].source.type`; empty for the whole file.
    public let key: String
    public let message: String

    public init(key: String, _ message: String) {
        self.key = key
        self.message = message
    }

    public var description: String { key.isEmpty ? message : "\(key): \(message)" }
}
