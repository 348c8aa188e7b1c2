// What the sink tests share: a private folder, and the file
// system calls the tests check the writer with (independent of the writer's own code).
import Foundation
import Glibc
import TokenBrokerCore
import TokenBrokerTestSupport

/// A temporary folder only its owner may enter and write (mode 0700 whatever the umask), as a
/// token file's directory must be.
func privateDirectory() throws -> TemporaryDirectory {
    let directory = try TemporaryDirectory()
    try setMode(directory.url.path, 0o700)
    return directory
}

struct SystemCallFailure: Error, CustomStringConvertible {
    let description: String
}

/// `chmod`, failing the test on error.
func setMode(_ path: String, _ mode: mode_t) throws {
    guard chmod(path, mode) == 0 else {
        throw SystemCallFailure(description: "chmod \(path): \(String(cString: strerror(errno)))")
    }
}

/// The permission bits (and set-id and sticky bits) of `path`, not following a final symbolic link; nil when missing.
func modeBits(_ path: String) -> mode_t? {
    var status = stat()
    guard lstat(path, &status) == 0 else { return nil }
    return status.st_mode & 0o7777
}

/// The file's contents as text; nil when it cannot be read.
func contents(_ path: String) -> String? {
    guard let data = FileManager.default.contents(atPath: path) else { return nil }
    return String(decoding: data, as: UTF8.self)
}

/// The names in `directory`, hidden ones included.
func entries(_ directory: String) -> [String] {
    (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
}

/// Runs `body` with the process's umask set to `mask`, then puts the previous one back.
///
/// The umask is the whole process's: tests that change it check only modes of their own files,
/// which the writer sets with `fchmod`, and every folder the sink tests make is given its mode with `chmod`.
func withUmask<T>(_ mask: mode_t, _ body: () throws -> T) rethrows -> T {
    let previous = umask(mask)
    defer { umask(previous) }
    return try body()
}

/// Makes `directory` refuse new entries, even to root: mode 0500, and for root (whom modes do
/// not stop) the immutable attribute; undone by the returned closure.
func makeReadOnly(_ directory: String) throws -> () throws -> Void {
    try setMode(directory, 0o500)
    guard geteuid() == 0 else { return { try setMode(directory, 0o700) } }
    try runTool("/usr/bin/chattr", ["+i", directory])
    return {
        try runTool("/usr/bin/chattr", ["-i", directory])
        try setMode(directory, 0o700)
    }
}

/// Runs a command line tool; throws with its output when it fails.
func runTool(_ path: String, _ arguments: [String]) throws {
    do {
        try CommandLineTool.run(path, arguments)
    } catch {
        throw SystemCallFailure(
            description: "\(error) (a read-only directory is needed even for root: the immutable attribute)")
    }
}

extension Result where Success == Void {
    /// The error of a failed write, or nil when it succeeded.
    var failed: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
