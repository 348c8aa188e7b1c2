// What several test targets share: the openssl command line, temporary folders, DER for
// ECDSA signatures, and polling for a condition. A library for tests only; the broker never links it.
import Foundation

/// Runs a command line tool and returns what it printed (standard output and error together).
public enum CommandLineTool {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    @discardableResult
    public static func run(_ path: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw Failure(description: "\(path) \(arguments.joined(separator: " ")) failed: \(text)")
        }
        return text
    }
}

/// Runs the `openssl` command line: an implementation independent of the code under test.
public enum OpenSSL {
    @discardableResult
    public static func run(_ arguments: [String]) throws -> String {
        try CommandLineTool.run("/usr/bin/openssl", arguments)
    }
}

/// A folder that removes itself.
public final class TemporaryDirectory {
    public let url: URL

    public init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("token-broker-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// Just enough DER to hand OpenSSL an ECDSA signature: SEQUENCE { INTEGER r, INTEGER s }.
public enum DER {
    public static func ecdsaSignature(raw: [UInt8]) -> [UInt8] {
        func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            var value = Array(bytes.drop { $0 == 0 })
            if value.isEmpty { value = [0] }
            if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
            return [0x02, UInt8(value.count)] + value
        }
        let body = integer(raw[0..<32]) + integer(raw[32..<64])
        return [0x30, UInt8(body.count)] + body
    }
}

/// Waits until `condition` holds, polling with real but short pauses; its last answer after `seconds`.
///
/// Only a generous bound for asynchronous hand-offs between tasks, never a timing assertion.
public func eventually(within seconds: Double = 10, _ condition: () -> Bool) async -> Bool {
    let end = ContinuousClock.now.advanced(by: .milliseconds(Int(seconds * 1000)))
    while ContinuousClock.now < end {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return condition()
}
