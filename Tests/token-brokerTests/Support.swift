import Foundation
import TokenBrokerCore

@testable import token_broker

/// A folder that removes itself, with files written into it by name.
final class TemporaryDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "token-broker-executable-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// Writes `contents` to the file `name` and returns its path.
    @discardableResult
    func write(_ name: String, _ contents: String) throws -> String {
        try Data(contents.utf8).write(to: URL(fileURLWithPath: path(name)))
        return path(name)
    }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// `json` read as the broker's configuration; the test fails with the reason when it is refused.
func configuration(_ json: String) throws -> BrokerConfiguration {
    try BrokerConfiguration(json: Array(json.utf8))
}

/// The problem `Broker.makeSources` reports for `providers` (a JSON array), or nil when it builds them.
func sourceProblem(_ providers: String) throws -> ConfigurationError? {
    let settings = try configuration(#"{"providers": \#(providers)}"#)
    do {
        _ = try Broker.makeSources(settings)
        return nil
    } catch {
        return error
    }
}
