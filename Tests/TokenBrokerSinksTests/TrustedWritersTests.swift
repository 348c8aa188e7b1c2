import Foundation
import Glibc
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import TokenBrokerSinks

/// A token file's directory that others may write, opened trusting its writers
/// (`SinkConfiguration.trustDirectoryWriters`, a Kubernetes emptyDir: mode 0777, or 2777 with an
/// fsGroup): which checks the trust lifts, which stay, and what another writer of the directory
/// can and cannot do to a write. The "other writer" is this process, planting names as anyone
/// who may write the directory could.
@Suite(.serialized) struct TrustedWritersTests {
    /// A folder `shared` in a private one, with `mode` (set with `chmod`, whatever the umask); the
    /// private one is removed when the returned object goes (keep it with `withExtendedLifetime`).
    private func sharedDirectory(_ mode: mode_t = 0o777) throws -> (TemporaryDirectory, String) {
        let directory = try privateDirectory()
        let shared = directory.path("shared")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: false)
        try setMode(shared, mode)
        return (directory, shared)
    }

    /// A writer of `shared/token` through `shared` opened trusting its writers.
    private func trustedWriter(_ shared: String, mode: UInt32 = 0o640) throws -> AtomicFileWriter {
        let directory = try SinkDirectory.open(shared, trustingWriters: true).get()
        return AtomicFileWriter(directory: directory, path: shared + "/token", mode: mode)
    }

    // MARK: - What the trust lifts, and what it does not

    @Test func aDirectoryOthersCanWriteIsOpenedOnlyWhenItsWritersAreTrusted() throws {
        for mode: mode_t in [0o777, 0o2777, 0o1777, 0o702] {
            let (folder, shared) = try sharedDirectory(mode)
            guard case .failure(let refused) = SinkDirectory.open(shared) else {
                Issue.record("mode \(String(mode, radix: 8)): accepted without trust")
                continue
            }
            #expect(
                refused.description.hasPrefix(
                    "the directory \(shared) is writable by other users (mode 0\(String(mode, radix: 8)))"),
                "\(refused)")
            #expect(refused.trustWouldLift, "the broker names the opt-in that lifts it")
            let opened = try SinkDirectory.open(shared, trustingWriters: true).get()
            #expect(opened.trustsWriters)
            #expect(opened.otherWriters == ["\(shared) (mode 0\(String(mode, radix: 8)))"])
            withExtendedLifetime(folder) {}
        }
        let (ownFolder, own) = try sharedDirectory(0o750)
        let opened = try SinkDirectory.open(own, trustingWriters: true).get()
        #expect(opened.trustsWriters && opened.otherWriters.isEmpty, "trusted, and nobody else may write it now")
        #expect(try SinkDirectory.open(own).get().trustsWriters == false)
        withExtendedLifetime(ownFolder) {}
    }

    @Test func aDirectoryAboveOthersCanWriteIsNotedWhenTrusted() throws {
        let (directory, shared) = try sharedDirectory(0o777)
        let folder = shared + "/tokens"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o700)
        guard case .failure(let refused) = SinkDirectory.open(folder) else {
            Issue.record("accepted without trust")
            return
        }
        #expect(
            refused.description.contains(
                "\(shared), a directory above \(folder), is writable by other users (mode 0777)"))
        #expect(refused.trustWouldLift)
        let opened = try SinkDirectory.open(folder, trustingWriters: true).get()
        #expect(opened.otherWriters == ["\(shared), a directory above (mode 0777)"])
        withExtendedLifetime(directory) {}
    }

    @Test(.enabled(if: geteuid() == 0, "only root can give a directory to another user"))
    func theOwnersOfTheDirectoryAndOfThoseAboveAreCheckedTrustedOrNot() throws {
        let (directory, shared) = try sharedDirectory(0o777)
        // nobody (65534) owns it: its owner could do anything there, and is no writer the trust names.
        #expect(chown(shared, 65_534, 65_534) == 0)
        #expect(
            SinkDirectory.problem(for: shared + "/token", trustingWriters: true)?.contains(
                "the directory \(shared) is owned by user 65534") == true)
        if case .failure(let problem) = SinkDirectory.open(shared, trustingWriters: true) {
            #expect(!problem.trustWouldLift)
        }
        #expect(chown(shared, 0, 65_534) == 0)
        #expect(SinkDirectory.problem(for: shared + "/token", trustingWriters: true) == nil, "owned by root")

        let folder = shared + "/tokens"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        try setMode(folder, 0o700)
        #expect(chown(shared, 65_534, 65_534) == 0)
        #expect(
            SinkDirectory.problem(for: folder + "/token", trustingWriters: true)?.contains(
                "\(shared), a directory above \(folder), is owned by user 65534") == true)
        #expect(chown(shared, 0, 0) == 0)
        withExtendedLifetime(directory) {}
    }

    // MARK: - What another writer of the directory cannot do

    @Test func aSymbolicLinkPlantedAtThePathIsReplacedNotFollowed() throws {
        let (directory, shared) = try sharedDirectory()
        let victim = directory.path("victim")
        try "victim's own".write(toFile: victim, atomically: false, encoding: .utf8)
        try setMode(victim, 0o644)
        #expect(symlink(victim, shared + "/token") == 0)
        let writer = try trustedWriter(shared)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(contents(victim) == "victim's own" && modeBits(victim) == 0o644, "the link's target is untouched")
        var status = stat()
        #expect(lstat(shared + "/token", &status) == 0 && status.st_mode & S_IFMT == S_IFREG, "a file of its own")
        #expect(contents(shared + "/token") == "token-1" && modeBits(shared + "/token") == 0o640)
        withExtendedLifetime(directory) {}
    }

    @Test func aHardLinkPlantedAtThePathIsReplacedNotWrittenThrough() throws {
        let (directory, shared) = try sharedDirectory()
        let victim = directory.path("victim")
        try "victim's own".write(toFile: victim, atomically: false, encoding: .utf8)
        #expect(link(victim, shared + "/token") == 0)
        let writer = try trustedWriter(shared)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(contents(victim) == "victim's own")
        var status = stat()
        #expect(
            stat(victim, &status) == 0 && status.st_nlink == 1, "the planted name is gone, the file it named is not")
        #expect(contents(shared + "/token") == "token-1")
        withExtendedLifetime(directory) {}
    }

    @Test func namesPlantedAtTheTemporaryFilesNeitherReceiveTheTokenNorAreFollowed() throws {
        let (directory, shared) = try sharedDirectory()
        let victim = directory.path("victim")
        try "victim's own".write(toFile: victim, atomically: false, encoding: .utf8)
        let writer = try trustedWriter(shared)
        let next = writer.nextTemporaryNumber
        // A link to the victim, a file of the planter's, a FIFO (whose open would block) and a directory.
        #expect(symlink(victim, writer.temporaryPath(next)) == 0)
        #expect(FileManager.default.createFile(atPath: writer.temporaryPath(next + 1), contents: Data("theirs".utf8)))
        #expect(mkfifo(writer.temporaryPath(next + 2), 0o666) == 0)
        #expect(mkdir(writer.temporaryPath(next + 3), 0o777) == 0)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(contents(shared + "/token") == "token-1")
        #expect(contents(victim) == "victim's own")
        #expect(contents(writer.temporaryPath(next + 1)) == "theirs", "the planted file got nothing")
        #expect(entries(shared).count == 5, "the four planted names stay, beside the token file")
        withExtendedLifetime(directory) {}
    }

    @Test func aDirectoryPlantedAtThePathFailsTheWriteAndLeavesNothingElsewhere() throws {
        let (directory, shared) = try sharedDirectory()
        let path = shared + "/token"
        let writer = try trustedWriter(shared)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(unlink(path) == 0 && mkdir(path, 0o777) == 0)
        let error = writer.write(Array("token-2".utf8)).failed
        #expect(error?.call == "rename" && error?.code == EISDIR, "\(String(describing: error))")
        #expect(entries(shared) == ["token"] && entries(path).isEmpty, "no temporary file is left")
        let blocked =
            "the token file \(path) is a directory (made by a writer of its directory), which no write can replace: "
            + "each write fails, and is tried again, until it is removed"
        #expect(writer.replacementProblem() == blocked, "not a file readers read until the next write: none lands")
        #expect(try trustedWriter(shared).replacementProblem() == blocked, "reported before any write too")
        #expect(rmdir(path) == 0 && writer.write(Array("token-3".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil)
        withExtendedLifetime(directory) {}
    }

    @Test func whatAWriterOfTheDirectoryPutsAtThePathIsAWarningNotARefusalWhenTrusted() throws {
        let (directory, shared) = try sharedDirectory()
        let path = shared + "/token"
        let trusted = try SinkDirectory.open(shared, trustingWriters: true).get()
        #expect(trusted.fileProblem(for: path) == nil && trusted.plantedEntry(for: path) == nil, "nothing there")
        try "theirs".write(toFile: path, atomically: false, encoding: .utf8)
        #expect(trusted.plantedEntry(for: path) == nil, "a file, which the first write replaces, is no news")
        #expect(unlink(path) == 0 && mkdir(path, 0o777) == 0)
        // Any writer of the directory can make it: it must not stop every start and reload.
        #expect(trusted.fileProblem(for: path) == nil)
        #expect(SinkDirectory.problem(for: path, trustingWriters: true) == nil)
        #expect(
            trusted.plantedEntry(for: path)
                == "\(path) is a directory, which no write can replace: each write fails, is logged, counted and tried "
                + "again, and /readyz reports the file not ready, until it is removed")
        #expect(rmdir(path) == 0 && mkfifo(path, 0o666) == 0)
        #expect(trusted.fileProblem(for: path) == nil)
        #expect(trusted.plantedEntry(for: path) == "\(path) is a FIFO, not a file: the first write replaces it")
        #expect(unlink(path) == 0 && symlink("/etc/hostname", path) == 0)
        #expect(
            trusted.plantedEntry(for: path) == "\(path) is a symbolic link, not a file: the first write replaces it")

        // Not trusted, only its owner or root could have made a directory there: refused as before.
        #expect(unlink(path) == 0 && mkdir(path, 0o700) == 0 && chmod(shared, 0o700) == 0)
        let own = try SinkDirectory.open(shared).get()
        #expect(
            own.fileProblem(for: path)
                == "\(path) is a directory; allowed: the path of a file (it is created if missing)")
        #expect(own.plantedEntry(for: path) == nil)
        withExtendedLifetime(directory) {}
    }

    // MARK: - What it can do, and how it shows

    @Test func aFileRemovedOrReplacedBetweenWritesIsReportedUntilTheNextWrite() throws {
        let (directory, shared) = try sharedDirectory()
        let path = shared + "/token"
        let writer = try trustedWriter(shared)
        #expect(writer.replacementProblem() == nil, "nothing written yet: nothing replaced")
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil)

        #expect(unlink(path) == 0)
        #expect(
            writer.replacementProblem()
                == "the token file \(path) was removed since the broker wrote it (by a writer of its directory); the "
                + "broker writes it again")
        #expect(writer.write(Array("token-2".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil)

        // Replaced by a file of the same contents but another mode: another file all the same,
        // which other readers may read.
        try "token-2".write(toFile: shared + "/theirs", atomically: false, encoding: .utf8)
        try setMode(shared + "/theirs", 0o644)
        #expect(rename(shared + "/theirs", path) == 0)
        #expect(
            writer.replacementProblem()
                == "the token file \(path) was replaced since the broker wrote it (by a writer of its directory), with "
                + "another file: readers of the path read it until the broker writes the file again")
        #expect(symlink("/etc/hostname", shared + "/link") == 0 && rename(shared + "/link", path) == 0)
        #expect(
            writer.replacementProblem()?.contains(
                "was replaced since the broker wrote it (by a writer of its "
                    + "directory), with a symbolic link") == true)
        #expect(unlink(path) == 0 && mkfifo(path, 0o666) == 0)
        #expect(writer.replacementProblem()?.contains("with a FIFO") == true, "never opened: the look would block")
        #expect(writer.write(Array("token-3".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil)
        #expect(contents(path) == "token-3")

        // A reload gives the file a writer of its own and retires this one: the file is then the
        // successor's, and its writes are no replacement the retired writer reports.
        #expect(writer.retire(waitingAtMost: .seconds(1)))
        let successor = try trustedWriter(shared)
        #expect(successor.write(Array("token-4".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil && successor.replacementProblem() == nil)
        withExtendedLifetime(directory) {}
    }

    @Test func aRunnerOpensItsDirectoryTrustingItsWritersOnlyWhenConfiguredTo() throws {
        let (directory, shared) = try sharedDirectory(0o2777)
        let provider = TokenProvider(
            configuration: ProviderConfiguration(name: "p"), source: ScriptedSource(), clock: ManualClock())
        #expect(throws: SinkDirectoryProblem.self) {
            try SinkRunner(configuration: SinkConfiguration(provider: "p", path: shared + "/t"), provider: provider)
        }
        let runner = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: shared + "/t", trustDirectoryWriters: true),
            provider: provider)
        #expect(runner.status().problem == nil)
        withExtendedLifetime(directory) {}
    }

    // MARK: - Another writer of the same file, and a writer of the file itself

    /// Writes `text` into the file `path` in place, as `printf text > path` does: the same inode.
    private func overwrite(_ path: String, _ text: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.close()
    }

    @Test func anotherWritersCopyOfWhatWasWrittenIsTakenAsTheFileAndAnythingElseIsNot() throws {
        let (directory, shared) = try sharedDirectory()
        let path = shared + "/token"
        // Two writers of one file, as two brokers (an overlapping restart, a fleet on a shared path).
        let (first, second) = (try trustedWriter(shared), try trustedWriter(shared))
        #expect(first.write(Array("token-1".utf8)).failed == nil)
        #expect(second.write(Array("token-1".utf8)).failed == nil)
        #expect(first.replacementProblem() == nil, "the other's file holds what it wrote, made as it made its own")
        #expect(second.replacementProblem() == nil)
        // Taken as the file: the first writer now answers for the second's, changes in place included.
        try overwrite(path, "token-2")
        #expect(first.replacementProblem()?.contains("was changed in place") == true)
        try overwrite(path, "token-1")
        #expect(first.replacementProblem() == nil && second.replacementProblem() == nil)
        // Another token: they disagree, and each write of one is a replacement for the other.
        #expect(second.write(Array("token-X".utf8)).failed == nil)
        #expect(first.replacementProblem()?.contains("was replaced since the broker wrote it") == true)
        #expect(second.replacementProblem() == nil)
        #expect(first.write(Array("token-1".utf8)).failed == nil)
        #expect(second.replacementProblem()?.contains("was replaced since the broker wrote it") == true)

        // The same contents, in a file made otherwise: another group, or another length.
        let copy = shared + "/copy"
        try "token-1".write(toFile: copy, atomically: false, encoding: .utf8)
        try setMode(copy, 0o640)
        #expect(rename(copy, path) == 0)
        #expect(first.replacementProblem() == nil, "made alike: the same owner, group, mode and contents")
        try "token-1\n".write(toFile: copy, atomically: false, encoding: .utf8)
        try setMode(copy, 0o640)
        #expect(rename(copy, path) == 0)
        #expect(first.replacementProblem()?.contains("was replaced") == true, "a newline more")
        if geteuid() == 0 {
            try "token-1".write(toFile: copy, atomically: false, encoding: .utf8)
            try setMode(copy, 0o640)
            #expect(chown(copy, 0, 4343) == 0 && rename(copy, path) == 0)
            #expect(first.replacementProblem()?.contains("was replaced") == true, "another group may read it")
        }
        withExtendedLifetime(directory) {}
    }

    @Test func aFileChangedInPlaceIsReportedUntilTheNextWriteAndOnlyAChangeOfItsContentsIs() throws {
        let (directory, shared) = try sharedDirectory()
        let path = shared + "/token"
        let writer = try trustedWriter(shared, mode: 0o660)
        #expect(writer.write(Array("token-1".utf8)).failed == nil)
        // A member of the file's group rewrites it through its path: the same inode, other contents.
        func overwrite(_ text: String) throws { try self.overwrite(path, text) }
        try overwrite("attacker")
        let changed =
            "the token file \(path) was changed in place since the broker wrote it (by whoever may write the file, "
            + "such as its group when its mode lets the group write): readers of the path read other contents until "
            + "the broker writes the file again"
        #expect(writer.replacementProblem() == changed)
        try overwrite("token-2")
        #expect(writer.replacementProblem() == changed, "the same length, other contents")
        try overwrite("token-1")
        #expect(writer.replacementProblem() == nil, "what was written, written again: readers read the same")
        // A hard link, a new modification time: the contents are the same, and so is what readers read.
        #expect(link(path, shared + "/another-name") == 0 && unlink(shared + "/another-name") == 0)
        #expect(utimensat(AT_FDCWD, path, nil, 0) == 0, "now")
        #expect(writer.replacementProblem() == nil)
        try overwrite("token-1 and more")
        #expect(writer.replacementProblem() == changed, "grown")
        #expect(writer.write(Array("token-3".utf8)).failed == nil)
        #expect(writer.replacementProblem() == nil, "a new file, renamed over the changed one")
        #expect(contents(path) == "token-3")
        withExtendedLifetime(directory) {}
    }
}
