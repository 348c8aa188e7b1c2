// What several test targets share: the openssl command line, temporary folders, DER for
// ECDSA signatures, and polling for a condition. A library for tests only; the broker never links it.
import Foundation
import Glibc

/// Runs a command line tool and returns what it printed (standard output and error together).
///
/// Spawned with `posix_spawn` and read through a socket pair, not with Foundation's `Process`, whose
/// child monitoring on Linux goes through libdispatch sources shared by every test running in
/// parallel: this way a tool's run involves only its own socket pair and its own `waitpid`.
public enum CommandLineTool {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The most a tool may print, and the longest it may take.
    static let mostOutput = 16 * 1024 * 1024
    static let timeoutMilliseconds: Int32 = 60_000

    @discardableResult
    public static func run(_ path: String, _ arguments: [String]) throws -> String {
        let shown = "\(path) \(arguments.joined(separator: " "))"
        var ends: [Int32] = [-1, -1]
        // A socket pair rather than a pipe: it is made close-on-exec at once (Glibc's module has
        // no `pipe2`), so that no other test's child, spawned meanwhile, inherits an end.
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else {
            throw Failure(description: "\(shown): socketpair: errno \(errno)")
        }
        let (readEnd, writeEnd) = (ends[0], ends[1])
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // The child's standard output and error are the socket (dup2 clears close-on-exec on the copies).
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 2)
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var child: pid_t = 0
        let spawned = posix_spawn(&child, path, &actions, nil, argv, environ)
        close(writeEnd)
        guard spawned == 0 else {
            close(readEnd)
            throw Failure(description: "\(shown): posix_spawn: \(String(cString: strerror(spawned)))")
        }
        let (output, readProblem) = readAll(readEnd)
        close(readEnd)
        if readProblem != nil { kill(child, SIGKILL) }
        var status: Int32 = 0
        while waitpid(child, &status, 0) < 0 {
            guard errno == EINTR else { throw Failure(description: "\(shown): waitpid: errno \(errno)") }
        }
        let text = String(decoding: output, as: UTF8.self)
        if let readProblem { throw Failure(description: "\(shown): \(readProblem)") }
        // Exited (the low 7 bits 0) with status 0 (the next 8 bits).
        guard status & 0x7f == 0, (status >> 8) & 0xff == 0 else {
            throw Failure(description: "\(shown) failed (wait status \(status)): \(text)")
        }
        return text
    }

    /// Everything read from `fd` until end of file; the reason when it stopped before.
    private static func readAll(_ fd: Int32) -> ([UInt8], String?) {
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let end = ContinuousClock.now.advanced(by: .milliseconds(Int(timeoutMilliseconds)))
        while output.count <= mostOutput {
            let left = ContinuousClock.now.duration(to: end)
            guard left > .zero else { return (output, "no end after \(timeoutMilliseconds) ms") }
            var pollFD = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pollFD, 1, Int32(left.components.seconds * 1000 + 1))
            if ready < 0, errno == EINTR { continue }
            guard ready >= 0 else { return (output, "poll: errno \(errno)") }
            guard ready > 0 else { continue }
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return (output, nil) }
            if count < 0 {
                if errno == EINTR { continue }
                return (output, "read: errno \(errno)")
            }
            output += chunk[0..<count]
        }
        return (output, "printed more than \(mostOutput) bytes")
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
