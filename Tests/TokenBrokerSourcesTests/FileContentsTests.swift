import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import TokenBrokerSources

/// Files are read without ever waiting: what is not a regular file is refused, sizes are capped.
@Suite struct FileContentsTests {
    /// Runs `read` on a thread of its own and waits at most 5 s for it, so that a read that
    /// blocks fails the test instead of hanging it.
    private func boundedRead(_ path: String, limit: Int = FileContents.defaultLimit) -> Result<[UInt8], FileReadError>?
    {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox()
        Thread.detachNewThread {
            box.result = FileContents.read(path, limit: limit)
            done.signal()
        }
        guard done.wait(timeout: .now() + 5) == .success else { return nil }
        return box.result
    }

    private final class ResultBox: @unchecked Sendable {
        // Written by the reading thread before it signals, read after the wait: ordered by the semaphore.
        var result: Result<[UInt8], FileReadError>?
    }

    @Test func aFIFOIsRefusedAtOnceWithoutWaitingForAWriter() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("fifo")
        #expect(mkfifo(path, 0o600) == 0)
        guard let result = boundedRead(path) else {
            Issue.record("reading a FIFO blocked")
            return
        }
        #expect(result.failure?.isNotRegular == true)
        #expect(result.failure?.reason == "is a FIFO, not a regular file")
    }

    @Test(arguments: [
        ("/dev/zero", "is a character device, not a regular file"), ("/", "is a directory, not a regular file"),
    ])
    func devicesAndDirectoriesAreRefused(_ path: String, _ reason: String) {
        guard let result = boundedRead(path) else {
            Issue.record("reading \(path) blocked")
            return
        }
        #expect(result.failure?.reason == reason)
    }

    @Test func aFileLargerThanTheLimitIsRefusedAndOneAtTheLimitIsRead() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("file")
        try Data(repeating: 0x61, count: 1000).write(to: URL(fileURLWithPath: path))
        #expect(FileContents.read(path, limit: 1000) == .success([UInt8](repeating: 0x61, count: 1000)))
        #expect(FileContents.read(path, limit: 999).failure?.isTooLarge == true)
        #expect(FileContents.read(path, limit: 999).failure?.reason == "is larger than 999 bytes")
        #expect(FileContents.read(directory.path("missing")).failure?.reason == "No such file or directory")
    }

    @Test func secretFilesNameThePathOfWhatIsNotARegularFile() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("secret")
        #expect(mkfifo(path, 0o600) == 0)
        #expect(throws: TokenFetchError.configuration("cannot read \(path): is a FIFO, not a regular file")) {
            try SecretFile.readLine(path)
        }
    }

    @Test func aTokenFileThatIsAFIFOIsAnErrorNotAWait() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("token")
        #expect(mkfifo(path, 0o600) == 0)
        let source = FileTokenSource(configuration: FileSourceConfiguration(path: path))
        #expect(
            throws: TokenFetchError.unreachable("cannot read the token file \(path): is a FIFO, not a regular file")
        ) {
            try source.read(now: WallTime())
        }
    }
}
