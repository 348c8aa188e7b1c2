import Dispatch
import Foundation
import Glibc
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import TokenBrokerSinks

/// The atomic writer and the start-up check of a token file's directory. Serialized: some tests
/// change the process's umask, which the others' expectations must not meet halfway.
@Suite(.serialized) struct AtomicFileWriterTests {
    @Test func theModeIsExactlyTheConfiguredOneAfterEveryWriteWhateverTheUmask() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        for (mask, mode) in [(mode_t(0), UInt32(0o640)), (0o077, 0o640), (0, 0o400), (0o022, 0o660), (0, 0o600)] {
            let writer = try AtomicFileWriter(path: path, mode: mode)
            let result = withUmask(mask) { writer.write(Array("value-\(mode)".utf8)) }
            #expect(result.failed == nil, "umask \(String(mask, radix: 8)), mode \(String(mode, radix: 8))")
            #expect(modeBits(path) == mode_t(mode), "umask \(String(mask, radix: 8))")
            #expect(contents(path) == "value-\(mode)")
        }
        #expect(entries(directory.url.path) == ["token"], "no temporary file is left behind")
    }

    @Test func aTokenIsWrittenWithoutANewlineAndReplacesALongerOne() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let writer = try AtomicFileWriter(path: path, mode: 0o600)
        #expect(writer.write(Array(String(repeating: "a", count: 40_000).utf8)).failed == nil)
        #expect(writer.write(Array("short".utf8)).failed == nil)
        #expect(contents(path) == "short")
    }

    @Test func aNamePlantedAtTheTemporaryFileIsNeitherFollowedNorReused() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let victim = directory.path("victim")
        try "victim's own".write(toFile: victim, atomically: false, encoding: .utf8)
        let writer = try AtomicFileWriter(path: path, mode: 0o600)
        let planted = writer.temporaryPath(writer.nextTemporaryNumber)
        #expect(symlink(victim, planted) == 0)

        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(contents(path) == "token-1")
        #expect(contents(victim) == "victim's own", "O_EXCL | O_NOFOLLOW: the link was not followed")
        var status = stat()
        #expect(lstat(planted, &status) == 0 && status.st_mode & S_IFMT == S_IFLNK, "the planted link stays as it was")
    }

    @Test func whenEveryTemporaryNameIsTakenTheWriteFailsAndTheFileStays() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let writer = try AtomicFileWriter(path: path, mode: 0o600)
        #expect(writer.write(Array("old".utf8)).failed == nil)
        let first = writer.nextTemporaryNumber
        for number in first..<first + UInt64(AtomicFileWriter.maximumAttempts) {
            #expect(FileManager.default.createFile(atPath: writer.temporaryPath(number), contents: Data("x".utf8)))
        }
        guard case .failure(let error) = writer.write(Array("new".utf8)) else {
            Issue.record("the write should fail: every temporary name is taken")
            return
        }
        #expect(error.call == "open")
        #expect(error.code == EEXIST)
        #expect(error.description.hasSuffix(": File exists"))
        #expect(contents(path) == "old")
        #expect(writer.write(Array("new".utf8)).failed == nil, "the next write takes the next free name")
        #expect(contents(path) == "new")
    }

    @Test func aReadOnlyDirectoryGivesAReportedFailureAndTheOldFileStays() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let writer = try AtomicFileWriter(path: path, mode: 0o640)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        let undo = try makeReadOnly(directory.url.path)
        let result = writer.write(Array("token-2".utf8))
        try undo()
        guard case .failure(let error) = result else {
            Issue.record("a write into a read-only directory should fail")
            return
        }
        #expect(error.call == "open")
        #expect([EACCES, EPERM].contains(error.code), "\(error)")
        #expect(error.description.contains(directory.url.path))
        #expect(contents(path) == "token-1")
        #expect(modeBits(path) == 0o640)
        #expect(entries(directory.url.path) == ["token"])
    }

    @Test func aRenameOverADirectoryFailsAndRemovesTheTemporaryFile() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        try "x".write(toFile: path + "/inside", atomically: false, encoding: .utf8)
        let result = try AtomicFileWriter(path: path, mode: 0o600).write(Array("token-1".utf8))
        guard case .failure(let error) = result else {
            Issue.record("renaming a file over a directory should fail")
            return
        }
        #expect(error.call == "rename")
        #expect(entries(directory.url.path) == ["token"], "the temporary file is removed")
    }

    @Test func aRetiredWritersWritesAreAbandonedAndTheFileKeepsItsSuccessors() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let old = try AtomicFileWriter(path: path, mode: 0o600)
        let successor = try AtomicFileWriter(path: path, mode: 0o600)
        #expect(old.write(Array("old-1".utf8)).failed == nil)
        #expect(old.retire(waitingAtMost: .seconds(10)), "no rename under way")
        #expect(successor.write(Array("new-1".utf8)).failed == nil)
        guard case .failure(let error) = old.write(Array("old-2".utf8)) else {
            Issue.record("a retired writer's write should be abandoned")
            return
        }
        #expect(error.isAbandoned && error.call == "rename" && error.code == ECANCELED, "\(error)")
        #expect(contents(path) == "new-1")
        #expect(entries(directory.url.path) == ["token"], "the abandoned write's temporary file is removed")
    }

    @Test func onceRetireReturnsAWriterWritingMeanwhileNeverChangesTheFileAgain() throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let old = try AtomicFileWriter(path: path, mode: 0o600)
        let successor = try AtomicFileWriter(path: path, mode: 0o600)
        let started = DispatchSemaphore(value: 0)
        let ended = DispatchSemaphore(value: 0)
        let writes = Lock(0)
        // The old writer writes as fast as it can, 20,000 times at most, until its writes are abandoned.
        Thread.detachNewThread {
            started.signal()
            for index in 0..<20_000 {
                let result = old.write(Array("old-\(index)".utf8))
                writes.withLock { $0 += 1 }
                if case .failure(let error) = result, error.isAbandoned { break }
            }
            ended.signal()
        }
        started.wait()
        while writes.withLock({ $0 }) < 10 { usleep(1_000) }
        #expect(old.retire(waitingAtMost: .seconds(30)), "the rename under way ends")
        #expect(successor.write(Array("new".utf8)).failed == nil)
        #expect(ended.wait(timeout: .now() + 60) == .success, "the old writer's loop ends")
        #expect(contents(path) == "new", "no write of the old writer landed after retire() returned")
        #expect(entries(directory.url.path) == ["token"])
    }

    @Test func longNamesThatBeginAlikeKeepTheirLeftoversApart() throws {
        let directory = try privateDirectory()
        let stem = String(repeating: "n", count: 220)
        let first = try AtomicFileWriter(path: directory.path(stem + "-a"), mode: 0o600)
        let second = try AtomicFileWriter(path: directory.path(stem + "-b"), mode: 0o600)
        let leftover = first.temporaryPath(first.nextTemporaryNumber)
        #expect(leftover != second.temporaryPath(first.nextTemporaryNumber))
        #expect(leftover.utf8.count - directory.url.path.utf8.count < 250, "the name stays under NAME_MAX")
        #expect(FileManager.default.createFile(atPath: leftover, contents: Data("x".utf8)))
        #expect(second.removeLeftovers().removed == 0, "another file's leftover is not its own")
        #expect(modeBits(leftover) != nil)
        #expect(first.removeLeftovers().removed == 1)
        #expect(modeBits(leftover) == nil)
        #expect(first.write(Array("token".utf8)).failed == nil && contents(directory.path(stem + "-a")) == "token")
    }

    /// A reader looping over the file while it is replaced 200 times never sees a partial,
    /// empty or wrongly-moded file, nor a temporary file wider than the mode.
    @Test func aReaderNeverSeesAPartialEmptyOrWronglyModedFile() async throws {
        let directory = try privateDirectory()
        let path = directory.path("token")
        let mode: mode_t = 0o640
        let writer = try AtomicFileWriter(path: path, mode: UInt32(mode))
        // Each value says its own length, and lengths vary up to 64 KiB, so a partial read shows.
        func value(_ index: Int) -> String {
            let body = String(
                repeating: Character(UnicodeScalar(UInt8(97 + index % 26))), count: (index * 331) % 65_536)
            return "\(body.count):\(body)"
        }
        #expect(withUmask(0) { writer.write(Array(value(0).utf8)) }.failed == nil)
        let reader = LoopingReader(path: path, directory: directory.url.path, mode: mode)
        reader.start()
        var rotationProblems: [String] = []
        withUmask(0) {
            for index in 1...200 {
                let result = writer.write(Array(value(index).utf8))
                if let error = result.failed { rotationProblems.append("write \(index): \(error)") }
                if modeBits(path) != mode {
                    rotationProblems.append("write \(index): mode \(String(describing: modeBits(path)))")
                }
                if contents(path) != value(index) { rotationProblems.append("write \(index): other contents") }
            }
        }
        let (reads, problems) = await reader.stop()
        #expect(rotationProblems.isEmpty, "\(rotationProblems.prefix(5))")
        #expect(problems.isEmpty, "\(problems.prefix(5))")
        #expect(reads > 0, "the reader read while the file was replaced")
    }

    // MARK: - The directory check

    @Test func aMissingDirectoryIsRefused() throws {
        let directory = try privateDirectory()
        let problem = SinkDirectory.problem(for: directory.path("missing") + "/token")
        #expect(problem?.contains("does not exist") == true, "\(problem ?? "accepted")")
    }

    @Test func aFileInPlaceOfTheDirectoryIsRefused() throws {
        let directory = try privateDirectory()
        try "x".write(toFile: directory.path("file"), atomically: false, encoding: .utf8)
        let problem = SinkDirectory.problem(for: directory.path("file") + "/token")
        #expect(problem == "\(directory.path("file")) is not a directory")
    }

    @Test func aDirectoryOthersCanWriteIsRefusedStickyOrNot() throws {
        let directory = try privateDirectory()
        for mode: mode_t in [0o777, 0o1777, 0o702] {
            try setMode(directory.url.path, mode)
            let problem = SinkDirectory.problem(for: directory.path("token"))
            #expect(problem?.contains("is writable by other users") == true, "mode \(String(mode, radix: 8))")
            #expect(problem?.contains("mode 0\(String(mode, radix: 8))") == true, "\(problem ?? "accepted")")
        }
        try setMode(directory.url.path, 0o700)
    }

    @Test func aPrivateOrGroupDirectoryIsAccepted() throws {
        let directory = try privateDirectory()
        for mode: mode_t in [0o700, 0o750, 0o770] {
            try setMode(directory.url.path, mode)
            #expect(SinkDirectory.problem(for: directory.path("token")) == nil, "mode \(String(mode, radix: 8))")
        }
    }

    @Test(.enabled(if: geteuid() == 0, "only root can give a directory to another user"))
    func aDirectoryOwnedByAnotherUserIsRefused() throws {
        let directory = try privateDirectory()
        let folder = directory.path("theirs")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o755)
        // nobody (65534): whoever owns the directory can replace the token file in it.
        #expect(chown(folder, 65_534, 65_534) == 0)
        let problem = SinkDirectory.problem(for: folder + "/token")
        #expect(problem?.contains("the directory \(folder) is owned by user 65534") == true, "\(problem ?? "accepted")")
        #expect(chown(folder, 0, 65_534) == 0)
        #expect(SinkDirectory.problem(for: folder + "/token") == nil, "owned by root: accepted")
    }

    @Test func aParentOthersCanWriteIsRefusedUnlessSticky() throws {
        let directory = try privateDirectory()
        let parent = directory.path("shared")
        let folder = parent + "/tokens"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try setMode(folder, 0o700)
        for mode: mode_t in [0o777, 0o703] {
            // Anyone may rename tokens/ away and make a tokens/ of their own in its place.
            try setMode(parent, mode)
            let problem = SinkDirectory.problem(for: folder + "/token")
            #expect(
                problem?.contains("\(parent), a directory above \(folder), is writable by other users") == true,
                "mode \(String(mode, radix: 8)): \(problem ?? "accepted")")
        }
        try setMode(parent, 0o1777)
        #expect(SinkDirectory.problem(for: folder + "/token") == nil, "sticky, as /tmp: others cannot rename tokens/")
        try setMode(parent, 0o755)
        #expect(SinkDirectory.problem(for: folder + "/token") == nil)
    }

    @Test(.enabled(if: geteuid() == 0, "only root can give a directory to another user"))
    func aParentOwnedByAnotherUserIsRefusedWhateverItsMode() throws {
        let directory = try privateDirectory()
        let parent = directory.path("theirs")
        let folder = parent + "/tokens"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try setMode(folder, 0o700)
        // nobody (65534) owns theirs/: it may rename tokens/ away and make a tokens/ of its own
        // there, sticky bit or not, and readers of the path would read that one.
        #expect(chown(parent, 65_534, 65_534) == 0)
        for mode: mode_t in [0o755, 0o1777] {
            try setMode(parent, mode)
            let problem = SinkDirectory.problem(for: folder + "/token")
            #expect(
                problem?.contains("\(parent), a directory above \(folder), is owned by user 65534") == true,
                "mode \(String(mode, radix: 8)): \(problem ?? "accepted")")
        }
        #expect(chown(parent, 0, 65_534) == 0)
        #expect(SinkDirectory.problem(for: folder + "/token") == nil, "owned by root: accepted")
    }

    @Test func aParentReachedThroughASymbolicLinkIsTheOneChecked() throws {
        let directory = try privateDirectory()
        let parent = directory.path("shared")
        try FileManager.default.createDirectory(atPath: parent + "/tokens", withIntermediateDirectories: true)
        try setMode(parent + "/tokens", 0o700)
        try setMode(parent, 0o777)
        #expect(symlink(parent + "/tokens", directory.path("link")) == 0)
        let problem = SinkDirectory.problem(for: directory.path("link") + "/token")
        #expect(problem?.contains("\(parent), a directory above") == true, "\(problem ?? "accepted")")
    }

    @Test(.enabled(if: geteuid() == 0, "only root can give a directory or a link to another user"))
    func aLinkThatAnotherUserCouldRepointIsRefusedWhereverItLeads() throws {
        let directory = try privateDirectory()
        let target = directory.path("tokens")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: false)
        try setMode(target, 0o700)
        let holder = directory.path("theirs")
        try FileManager.default.createDirectory(atPath: holder, withIntermediateDirectories: false)
        try setMode(holder, 0o755)
        #expect(symlink(target, holder + "/link") == 0)
        // nobody (65534) owns the link's directory: it could point the link at a directory of its own.
        #expect(chown(holder, 65_534, 65_534) == 0)
        let problem = SinkDirectory.problem(for: holder + "/link/token")
        #expect(
            problem?.contains("\(holder), a directory above \(holder)/link, is owned by user 65534") == true,
            "\(problem ?? "accepted")")
        // In a sticky directory, the link's own owner could replace it.
        #expect(chown(holder, 0, 0) == 0)
        try setMode(holder, 0o1777)
        #expect(lchown(holder + "/link", 65_534, 65_534) == 0)
        let linkProblem = SinkDirectory.problem(for: holder + "/link/token")
        #expect(
            linkProblem?.contains(
                "\(holder)/link, a symbolic link on the way to \(holder)/link, is owned by user 65534")
                == true, "\(linkProblem ?? "accepted")")
        #expect(lchown(holder + "/link", 0, 0) == 0)
        #expect(SinkDirectory.problem(for: holder + "/link/token") == nil, "root's link in a sticky directory")
    }

    @Test func linksAreFollowedAsTheKernelWouldRelativeAbsoluteAndThroughDotDot() throws {
        let directory = try privateDirectory()
        let folder = directory.path("run")
        try FileManager.default.createDirectory(atPath: folder + "/inner", withIntermediateDirectories: true)
        try setMode(folder, 0o700)
        try setMode(folder + "/inner", 0o700)
        #expect(symlink("run/inner", directory.path("relative")) == 0)
        #expect(symlink(folder + "/inner", directory.path("absolute")) == 0)
        #expect(symlink("relative", directory.path("chained")) == 0)
        let inner = try SinkDirectory.open(folder + "/inner").get()
        for path in ["relative", "absolute", "chained", "chained/../inner", "absolute/../inner/."] {
            let opened = try SinkDirectory.open(directory.path(path)).get()
            #expect(opened.identity(of: "t") == inner.identity(of: "t"), "\(path)")
            #expect(opened.resolvedPath == inner.resolvedPath, "\(path)")
        }
        // `..` after a link is the parent of where the link leads, not the link's directory.
        #expect(try SinkDirectory.open(directory.path("absolute") + "/..").get().resolvedPath.hasSuffix("/run"))
        #expect(symlink("loop", directory.path("loop")) == 0)
        let problem = SinkDirectory.problem(for: directory.path("loop") + "/token")
        #expect(problem?.contains("Too many levels of symbolic links") == true, "\(problem ?? "accepted")")
        #expect(symlink("nowhere", directory.path("dangling")) == 0)
        #expect(SinkDirectory.problem(for: directory.path("dangling") + "/token")?.contains("does not exist") == true)
    }

    /// A name the file system cannot hold would fail every write (each rename), so it is
    /// refused at start; every name it can hold leaves room for the temporary files' names too.
    @Test func aFileNameLongerThanTheFileSystemAllowsIsRefused() throws {
        let directory = try privateDirectory()
        let problem = SinkDirectory.problem(for: directory.path(String(repeating: "a", count: 256)))
        #expect(
            problem?.contains("is 256 bytes long; allowed: at most 255") == true, "\(problem ?? "accepted")")
        #expect(SinkDirectory.problem(for: directory.path(String(repeating: "a", count: 255))) == nil)
        let writer = try AtomicFileWriter(path: directory.path(String(repeating: "a", count: 255)), mode: 0o600)
        #expect(writer.write(Array("token".utf8)).failed == nil, "a name of 255 bytes is written")
        // 127 two-byte characters and one byte: 255 bytes; 86 three-byte ones: 258.
        #expect(SinkDirectory.problem(for: directory.path(String(repeating: "é", count: 127) + "e")) == nil)
        #expect(SinkDirectory.problem(for: directory.path(String(repeating: "€", count: 86)))?.contains("258") == true)
        for length in 1...255 {
            for unit in ["a", "é", "€", "😀"] {
                var name = String(repeating: unit, count: length / unit.utf8.count)
                name += String(repeating: "a", count: length - name.utf8.count)
                #expect(AtomicFileWriter.longestTemporaryName(for: name) <= 255, "\(length) bytes of \(unit)")
            }
        }
    }

    @Test func theLongestTemporaryNameIsNoShorterThanTheOnesAWriteMakes() throws {
        let directory = try privateDirectory()
        for name in ["t", String(repeating: "b", count: 200), String(repeating: "c", count: 201)] {
            let writer = AtomicFileWriter(
                directory: try SinkDirectory.open(directory.url.path).get(), path: directory.path(name), mode: 0o600)
            let made = AtomicFileWriter.fileName(of: writer.temporaryPath(writer.nextTemporaryNumber))
            let longest = AtomicFileWriter.longestTemporaryName(for: name)
            #expect(made.utf8.count <= longest, "\(name.utf8.count) bytes: \(made.utf8.count) > \(longest)")
        }
    }

    /// Probe files a crash left behind, under the names a process with this id would have used
    /// (in a container, every start is process 1), do not make the directory unusable.
    @Test func probeFilesLeftBehindDoNotBlockTheNextCheck() throws {
        let directory = try privateDirectory()
        let folder = directory.path("store")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o700)
        for attempt in 0..<3 {
            #expect(
                FileManager.default.createFile(
                    atPath: folder + "/.token-broker-probe-\(getpid())-\(attempt)", contents: nil))
        }
        let opened = try SinkDirectory.open(folder).get()
        #expect(opened.creationProblem(holding: "record") == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: folder).count == 3, "its own probe is gone")
    }

    @Test func oneFileNamedThroughDotDotOrASymbolicLinkHasOneIdentity() throws {
        let directory = try privateDirectory()
        let folder = directory.path("run")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o700)
        #expect(symlink(folder, directory.path("link")) == 0)
        func identity(_ directory: String, _ name: String) throws -> SinkDirectory.FileIdentity {
            try SinkDirectory.open(directory).get().identity(of: name)
        }
        let plain = try identity(folder, "same.token")
        #expect(try identity(folder + "/../run", "same.token") == plain)
        #expect(try identity(directory.path("link"), "same.token") == plain)
        #expect(try identity(directory.path("link") + "/../run", "same.token") == plain)
        #expect(try identity(folder, "other.token") != plain)
        #expect(try identity(directory.url.path, "same.token") != plain)
    }

    @Test func writesGoToTheDirectoryOpenedAtStartEvenIfItsPathIsReplaced() throws {
        let directory = try privateDirectory()
        let folder = directory.path("run")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o700)
        let writer = try AtomicFileWriter(path: folder + "/token", mode: 0o600)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(writer.directory.replacementProblem() == nil)
        // What another user could do in a parent they can write: move the directory away, put another in its place.
        #expect(rename(folder, directory.path("moved")) == 0)
        #expect(writer.directory.replacementProblem()?.contains("cannot be examined now (No such file") == true)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(writer.directory.replacementProblem()?.contains("was renamed or replaced since") == true)
        #expect(writer.write(Array("token-2".utf8)).failed == nil)
        #expect(contents(directory.path("moved") + "/token") == "token-2")
        #expect(entries(folder).isEmpty, "nothing is written into the directory put in its place")
    }

    @Test func aDirectoryAtTheFilesPathIsRefused() throws {
        let directory = try privateDirectory()
        try FileManager.default.createDirectory(atPath: directory.path("token"), withIntermediateDirectories: false)
        #expect(
            SinkDirectory.problem(for: directory.path("token"))?.hasSuffix(
                "is a directory; allowed: the path of a file (it is created if missing)") == true)
    }
}

/// A thread that opens, checks and reads a file in a loop, and looks at every temporary file
/// beside it, until stopped; it collects what it found wrong.
private final class LoopingReader: @unchecked Sendable {
    private let path: String
    private let directory: String
    private let mode: mode_t
    private let state = Lock<(stop: Bool, reads: Int, problems: [String])>((false, 0, []))
    private let ended = Lock<CheckedContinuation<Void, Never>?>(nil)
    private var thread: Thread?

    init(path: String, directory: String, mode: mode_t) {
        self.path = path
        self.directory = directory
        self.mode = mode
    }

    func start() {
        let thread = Thread { [self] in loop() }
        self.thread = thread
        thread.start()
    }

    /// Stops the loop and waits for the thread to end; the reads it made and the problems it saw.
    func stop() async -> (reads: Int, problems: [String]) {
        state.withLock { $0.stop = true }
        while thread?.isFinished == false { try? await Task.sleep(for: .milliseconds(1)) }
        return state.withLock { ($0.reads, $0.problems) }
    }

    private func loop() {
        while !state.withLock({ $0.stop }) {
            if let problem = readOnce() { state.withLock { $0.problems.append(problem) } }
            state.withLock { $0.reads += 1 }
            for name in entries(directory) where name != "token" {
                // A temporary file: never wider than the mode, even before its fchmod.
                let fd = open(directory + "/" + name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
                guard fd >= 0 else { continue }  // renamed or removed meanwhile
                var status = stat()
                if fstat(fd, &status) == 0, status.st_mode & 0o7777 & ~mode != 0 {
                    state.withLock {
                        $0.problems.append("temporary \(name): mode \(String(status.st_mode & 0o7777, radix: 8))")
                    }
                }
                close(fd)
            }
        }
    }

    /// One whole read of the file, checked; nil when it was right.
    private func readOnce() -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "open: \(String(cString: strerror(errno)))" }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { return "fstat failed" }
        guard status.st_mode & 0o7777 == mode else { return "mode \(String(status.st_mode & 0o7777, radix: 8))" }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 { return "read: \(String(cString: strerror(errno)))" }
            if count == 0 { break }
            bytes += buffer[0..<count]
        }
        let text = String(decoding: bytes, as: UTF8.self)
        guard let colon = text.firstIndex(of: ":"), let length = Int(text[..<colon]) else {
            return bytes.isEmpty ? "empty file" : "no length header in \(bytes.count) bytes"
        }
        let body = text[text.index(after: colon)...]
        guard body.utf8.count == length else { return "partial: \(body.utf8.count) of \(length) bytes" }
        return nil
    }
}
