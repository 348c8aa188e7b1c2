import Glibc
import Testing
import TokenBrokerCore

@testable import TokenBrokerUpstream

/// The TLS files as the upstream client reads them for libcurl: read again whenever the file at
/// the path changed, refused (never waited on) when it is no regular file.
@Suite struct TLSFileCacheTests {
    /// A directory of the test's own under /tmp, removed with its files by `remove`.
    private static func directory() -> String {
        var template = Array("/tmp/tls-file-cache-XXXXXX".utf8CString)
        return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
    }

    private static func write(_ text: String, to path: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        precondition(fd >= 0)
        _ = Array(text.utf8).withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }

    private static func remove(_ directory: String, _ names: [String]) {
        for name in names { unlink("\(directory)/\(name)") }
        rmdir(directory)
    }

    private func text(_ result: Result<[UInt8], FileReadError>) -> String? {
        guard case .success(let bytes) = result else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test func aFileReplacedOrRewrittenInPlaceIsReadAgain() {
        let directory = Self.directory()
        defer { Self.remove(directory, ["ca.pem", "new.pem"]) }
        let path = "\(directory)/ca.pem"
        let cache = TLSFileCache()
        Self.write("first", to: path)
        #expect(text(cache.contents(of: path, limit: 1024)) == "first")
        #expect(text(cache.contents(of: path, limit: 1024)) == "first")
        // Another file renamed over it, of the same size.
        Self.write("other", to: "\(directory)/new.pem")
        #expect(rename("\(directory)/new.pem", path) == 0)
        #expect(text(cache.contents(of: path, limit: 1024)) == "other")
        // The same file rewritten in place, to the same size: only its times tell.
        Self.write("third", to: path)
        #expect(text(cache.contents(of: path, limit: 1024)) == "third")
        Self.write("a longer text", to: path)
        #expect(text(cache.contents(of: path, limit: 1024)) == "a longer text")
    }

    @Test func aFileThatBecameAFIFOOrWentAwayIsRefusedAtOnce() {
        let directory = Self.directory()
        defer { Self.remove(directory, ["ca.pem"]) }
        let path = "\(directory)/ca.pem"
        let cache = TLSFileCache()
        Self.write("first", to: path)
        #expect(text(cache.contents(of: path, limit: 1024)) == "first")
        unlink(path)
        #expect(mkfifo(path, 0o600) == 0)
        // No writer ever opens the FIFO: a read that waited for one would never return.
        guard case .failure(let error) = cache.contents(of: path, limit: 1024) else {
            Issue.record("a FIFO was read")
            return
        }
        #expect(error.reason == "is a FIFO, not a regular file")
        unlink(path)
        guard case .failure(let missing) = cache.contents(of: path, limit: 1024) else {
            Issue.record("a file that went away was served from the cache")
            return
        }
        #expect(missing.isMissing)
        Self.write("back", to: path)
        #expect(text(cache.contents(of: path, limit: 1024)) == "back")
    }

    @Test func aFileOverTheLimitIsRefused() {
        let directory = Self.directory()
        defer { Self.remove(directory, ["ca.pem"]) }
        let path = "\(directory)/ca.pem"
        Self.write(String(repeating: "a", count: 2000), to: path)
        guard case .failure(let error) = TLSFileCache().contents(of: path, limit: 1024) else {
            Issue.record("a file over the limit was read")
            return
        }
        #expect(error.isTooLarge)
    }
}
