import Glibc
import TokenBrokerCore
import TokenBrokerCrypto

/// Replaces a file's contents all at once, so that a reader sees the old contents or the new,
/// never a partial or empty file, nor a file with a wider mode than the one given.
///
/// Every call goes through the descriptor of the file's directory (`SinkDirectory`), opened
/// once at start, never through the directory's path: a directory renamed or replaced later
/// cannot redirect a write. Each `write`:
/// 1. creates a temporary file beside the target with `openat(O_RDWR | O_CREAT | O_EXCL |
///    O_CLOEXEC | O_NOFOLLOW, mode)`: a new file, never one that was there (not even a symbolic
///    link planted at its name), whose mode is at most `mode` from its first moment (the umask
///    can only narrow it); readable, so that the writer can read it back (`replacementProblem()`);
/// 2. sets the mode to exactly `mode` with `fchmod` (undoing what the umask took away);
/// 3. writes every byte (short writes continued, `EINTR` retried), then `fsync`s and closes it;
/// 4. `renameat`s it over the target, which readers then see whole, in one step;
/// 5. `fsync`s the directory, so that the rename survives a crash.
///
/// A failure at any step removes the temporary file, leaves the target as it was (before the
/// rename) and says which call failed and why (`FileWriteError`). A failed `fsync` of the
/// directory comes after the rename: the new contents are in place but may not survive a crash,
/// and it is reported as a failure all the same, so that the next write tries again.
///
/// Temporary files are named `.{name}.tmp-{pid}-{n}`; those a crash left behind are removed by
/// `removeLeftovers()`, which a sink calls at its start.
///
/// Whoever can write the directory (a directory trusted with `SinkDirectory.trustsWriters`) can
/// plant names there, and none of them can turn a write elsewhere: a symbolic link or a file at
/// a temporary name makes `O_EXCL` fail, and the next name is tried; a symbolic link, a hard
/// link or a file at the path is replaced by the rename, never followed or written through; a
/// directory at the path makes the rename fail, and the write with it. The token goes only into
/// the file this writer created. What such a writer can still do is replace or remove the file
/// between writes (or the temporary file before its rename), or put a directory at the path;
/// and whoever may write the file (its group, with mode 0660) can change it in place:
/// `replacementProblem()` says so.
///
/// A writer that another replaces (a reload gives a token file a writer of its own) is
/// retired (`retire(waitingAtMost:)`): from then on its writes are abandoned before their
/// rename, so that a write held up past its writer's stop (a slow `fsync`) cannot put an older
/// token over the newer writer's.
///
/// The calls block: run `write` off Swift's cooperative pool (`SinkRunner` uses a queue of its own).
public final class AtomicFileWriter: Sendable {
    /// The file replaced.
    public let path: String
    /// The permission bits the file gets, exactly.
    public let mode: UInt32
    /// The directory the file is in, where temporary files are made.
    let directory: SinkDirectory
    /// The file's name in `directory`.
    private let name: String
    /// The start of every temporary file's name: `.{name}.tmp-`.
    private let leftoverPrefix: [UInt8]
    /// The start of this process's temporary files' names: `.{name}.tmp-{pid}-`.
    private let temporaryPrefix: String
    /// Numbers temporary files, so that each write, and each retry after a name already taken, has
    /// its own. Each writer numbers from a start of its own (`generations`), so that the writers
    /// of one file in one process (one per reload) never make the same name: a retired writer's
    /// abandoned write removes its temporary file by name, which must not be its successor's.
    private let counter: Lock<UInt64>
    /// The writers made in this process so far: each counts from its number shifted 32 bits.
    private static let generations = Lock<UInt64>(0)
    /// Whether `retire(waitingAtMost:)` was called, and whether a rename is under way: a write
    /// renames only while not retired, so that once `retire` has seen no rename under way, none
    /// ever lands. The lock is never held across the rename itself, which a hung file system
    /// could hold up for as long as it likes.
    private let gate = Lock(Gate())

    private struct Gate {
        var retired = false
        var renaming = false
        /// The file the last successful write renamed over the path (or a copy of it that
        /// `replacementProblem()` took in its place), its descriptor held until another replaces
        /// it (or `deinit`), so that its inode cannot be reused.
        var written: HeldFile?
        /// The file a rename under way puts at the path.
        var landing: FileID?
        /// Counts the changes of `written`: a look at the path made while it changed is made again.
        var changes: UInt64 = 0
    }

    /// Temporary names tried before a write gives up, when names are already taken.
    static let maximumAttempts = 16

    /// A writer of `path`, a file in `directory` (opened and checked at start).
    public init(directory: SinkDirectory, path: String, mode: UInt32) {
        self.path = path
        self.mode = mode
        self.directory = directory
        name = Self.fileName(of: path)
        let prefix = Self.leftoverPrefix(of: name)
        leftoverPrefix = Array(prefix.utf8)
        temporaryPrefix = prefix + "\(getpid())-"
        let generation = Self.generations.withLock { generations in
            generations += 1
            return generations
        }
        counter = Lock(generation << 32)
    }

    deinit {
        // A descriptor only held (`Gate.written`): nothing to do about a failed close.
        if let held = gate.withLock({ $0.written?.descriptor }) { _ = Glibc.close(held) }
    }

    /// `.{name}.tmp-`, the start of every temporary file's name of the file `name`. A name near
    /// NAME_MAX (255 bytes) would leave no room for the suffix: past 200 bytes, the first 180 are
    /// kept with a hash of the whole, so that two long names that begin alike still have
    /// temporary files (and leftovers) of their own.
    private static func leftoverPrefix(of name: String) -> String {
        var kept = name
        if name.utf8.count > 200 {
            kept = ""
            for scalar in name.unicodeScalars {
                guard kept.utf8.count + String(scalar).utf8.count <= 180 else { break }
                kept.unicodeScalars.append(scalar)
            }
            kept += "~" + Fingerprint.of(name).dropFirst("sha256:".count)
        }
        return ".\(kept).tmp-"
    }

    /// The length in bytes of the longest temporary file's name a writer of the file `name`
    /// may use, whatever its process id and attempt number: what the directory's name limit
    /// must allow, besides `name` itself, for any write to succeed.
    public static func longestTemporaryName(for name: String) -> Int {
        leftoverPrefix(of: name).utf8.count + String(Int32.max).utf8.count + 1 + String(UInt64.max).utf8.count
    }

    /// A writer of `path`, its directory opened and checked (`SinkDirectory.open`) now.
    public convenience init(path: String, mode: UInt32) throws(SinkDirectoryProblem) {
        let directory = try SinkDirectory.open(BrokerConfiguration.directory(of: path)).get()
        self.init(directory: directory, path: path, mode: mode)
    }

    /// The last segment of `path`: the file's name in its directory.
    public static func fileName(of path: String) -> String {
        path.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? path
    }

    /// The name, in the directory, of the temporary file of attempt `number`.
    private func temporaryName(_ number: UInt64) -> String { temporaryPrefix + String(number) }

    /// The temporary file of attempt `number`, as a path, for messages (and tests).
    func temporaryPath(_ number: UInt64) -> String { inDirectory(temporaryName(number)) }

    /// `name` in the directory, as a path for messages.
    private func inDirectory(_ name: String) -> String {
        directory.path == "/" ? "/" + name : directory.path + "/" + name
    }

    /// The number the next write's first temporary file will have.
    var nextTemporaryNumber: UInt64 { counter.withLock { $0 + 1 } }

    /// Replaces the file's contents with `bytes`. Blocks: see the type's note.
    public func write(_ bytes: [UInt8]) -> Result<Void, FileWriteError> {
        let (temporary, fd): (String, Int32)
        switch createTemporary() {
        case .success(let created): (temporary, fd) = created
        case .failure(let error): return .failure(error)
        }
        var open = true
        func fail(_ error: FileWriteError) -> Result<Void, FileWriteError> {
            // The write already failed: a failed close of the abandoned descriptor adds nothing to say.
            if open { _ = Glibc.close(fd) }
            if unlinkat(directory.descriptor, temporary, 0) != 0 {
                let code = errno
                if code != ENOENT {
                    return .failure(error.addingCleanupFailure(unlink: inDirectory(temporary), code))
                }
            }
            return .failure(error)
        }
        let temporaryPath = inDirectory(temporary)
        guard fchmod(fd, mode_t(mode)) == 0 else { return fail(.system("fchmod", temporaryPath, errno)) }
        var created = stat()
        guard fstat(fd, &created) == 0 else { return fail(.system("fstat", temporaryPath, errno)) }
        let digest = HeldFile.digest(of: bytes)
        if let error = Self.writeAll(bytes, to: fd, path: temporaryPath) { return fail(error) }
        if let error = Self.sync(fd, path: temporaryPath) { return fail(error) }
        // Held while the file is the one written (`Gate.written`): an inode number is reused once
        // its file is gone, and a file of another's could otherwise pass for this one.
        let held = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard held >= 0 else { return fail(.system("fcntl", temporaryPath, errno)) }
        open = false
        // Linux closes the descriptor even when close fails (EINTR included): never close it twice.
        guard Glibc.close(fd) == 0 else {
            let code = errno
            _ = Glibc.close(held)
            return fail(.system("close", temporaryPath, code))
        }
        let written = HeldFile(created, descriptor: held, size: bytes.count, digest: digest)
        let admitted = gate.withLock { gate in
            guard !gate.retired else { return false }
            gate.renaming = true
            gate.landing = written.id
            return true
        }
        guard admitted else {
            _ = Glibc.close(held)
            return fail(.abandoned(path))
        }
        let renamed = renameat(directory.descriptor, temporary, directory.descriptor, name) == 0
        let code = errno
        let replaced = gate.withLock { gate -> Int32? in
            gate.renaming = false
            gate.landing = nil
            guard renamed else { return held }
            defer {
                gate.written = written
                gate.changes &+= 1
            }
            return gate.written?.descriptor
        }
        // The file written before, or this one when its rename failed: a descriptor only held, only closed.
        if let replaced { _ = Glibc.close(replaced) }
        guard renamed else { return fail(.system("rename", path, code)) }
        if let error = Self.sync(directory.descriptor, path: directory.path) { return .failure(error) }
        return .success(())
    }

    /// Why readers of the path do not read what this writer last wrote there, or nil while they
    /// do (or before the first write): since that write, a writer of the directory removed the
    /// file, or replaced it with a file, a link or anything else of their own; or whoever may
    /// write the file (its group, with mode 0660) changed its contents in place. Whatever the
    /// writes, a directory at the path is a problem too, since no write can replace it. Looked up
    /// through the directory's descriptor, without following a link.
    ///
    /// A file made as this writer's was (the same owner, group, mode and size: another writer of
    /// the same file, such as a second broker, which only the broker's user or root can make)
    /// that holds exactly what this writer wrote last is no problem: readers read the same. It is
    /// taken as the file from then on (`HeldFile.copy`), and is not written again. A write under
    /// way is no replacement; nor is anything once the writer is retired
    /// (`retire(waitingAtMost:)`), since the file is then its successor's to write.
    public func replacementProblem() -> String? {
        // A write may land while the path is looked at: the path is judged against a gate seen
        // unchanged across the look, tried a few times.
        for _ in 0..<3 {
            let seen = gate.withLock { Sight($0) }
            guard !seen.retired else { return nil }
            var status = stat()
            let found = fstatat(directory.descriptor, name, &status, AT_SYMLINK_NOFOLLOW) == 0
            let code = errno
            let verdict: Verdict
            if !found, code != ENOENT {
                verdict = .problem(unexaminable(code))
            } else if !found {
                verdict = seen.written == nil ? .same : .problem(removed)
            } else if status.st_mode & S_IFMT == S_IFDIR {
                verdict = .problem(blocked)
            } else if let written = seen.written, FileID(status) != seen.landing {
                verdict = judge(status, against: written, seen: seen)
            } else {
                verdict = .same
            }
            // Judged against what the gate held at the start, and a copy taken only while it still holds it.
            var previous: Int32?
            let unchanged = gate.withLock { gate -> Bool in
                guard Sight(gate) == seen else { return false }
                if case .copy(let copy) = verdict {
                    previous = gate.written?.descriptor
                    gate.written = copy
                    gate.changes &+= 1
                }
                return true
            }
            // Descriptors only held, only closed.
            if let previous { _ = Glibc.close(previous) }
            switch verdict {
            case .same:
                if unchanged { return nil }
            case .problem(let problem):
                if unchanged { return problem }
            case .copy(let copy):
                if unchanged { return nil }
                _ = Glibc.close(copy.descriptor)
            }
        }
        return nil
    }

    /// What the gate says at a look at the path; two are equal when nothing changed between them.
    private struct Sight: Equatable {
        let retired: Bool
        let written: HeldFile?
        let landing: FileID?
        let changes: UInt64

        init(_ gate: Gate) {
            (retired, written, landing, changes) = (gate.retired, gate.written, gate.landing, gate.changes)
        }

        static func == (a: Sight, b: Sight) -> Bool {
            (a.retired, a.landing, a.changes) == (b.retired, b.landing, b.changes)
        }
    }

    /// What a look at the path found.
    private enum Verdict {
        /// Readers of the path read what this writer wrote last.
        case same
        case problem(String)
        /// Another writer's copy of it (`HeldFile.copy`), open, to take in its place.
        case copy(HeldFile)
    }

    /// The file at the path, `status`, that is not a directory nor the file landing, judged
    /// against the file written last, as the gate held it when `seen`: the same file unchanged,
    /// another writer's copy of it, or a problem.
    private func judge(_ status: stat, against written: HeldFile, seen: Sight) -> Verdict {
        guard FileID(status) == written.id else {
            if let copy = HeldFile.copy(of: written, at: name, in: directory.descriptor, status: status) {
                return .copy(copy)
            }
            return .problem(
                "the token file \(path) was replaced since the broker wrote it (by a writer of its directory), "
                    + "with \(status.st_mode & S_IFMT == S_IFREG ? "another file" : SinkDirectory.kind(of: status)): "
                    + "readers of the path read it until the broker writes the file again")
        }
        // The file written, read back through a descriptor of its own: a write that replaces the
        // one held closes it meanwhile, and its number could then name another file.
        let duplicate = gate.withLock { gate -> (descriptor: Int32, code: Int32)? in
            guard Sight(gate) == seen, let held = gate.written else { return nil }
            let descriptor = fcntl(held.descriptor, F_DUPFD_CLOEXEC, 0)
            return (descriptor, errno)
        }
        // Replaced meanwhile: the look is made again.
        guard let (descriptor, code) = duplicate else { return .same }
        guard descriptor >= 0 else { return .problem(unexaminable(code)) }
        defer { _ = Glibc.close(descriptor) }
        guard let same = written.holdsTheSame(descriptor) else { return .problem(unexaminable(errno)) }
        guard same || written.digest == nil else {
            return .problem(
                "the token file \(path) was changed in place since the broker wrote it (by whoever may write the "
                    + "file, such as its group when its mode lets the group write): readers of the path read other "
                    + "contents until the broker writes the file again")
        }
        return .same
    }

    /// The file was removed since the last write.
    private var removed: String {
        "the token file \(path) was removed since the broker wrote it (by a writer of its directory); "
            + "the broker writes it again"
    }

    /// A directory at the path: no rename replaces it.
    private var blocked: String {
        "the token file \(path) is a directory (made by a writer of its directory), which no write can replace: "
            + "each write fails, and is tried again, until it is removed"
    }

    private func unexaminable(_ code: Int32) -> String {
        "the token file \(path) cannot be examined now (\(String(cString: strerror(code))))"
    }

    /// Abandons every write from now on before its rename (`FileWriteError.abandoned`; the write
    /// still removes its temporary file), and waits, at most `limit`, for a rename under way to
    /// end. True when none is under way any more: this writer then never changes the file again.
    /// False when one still is (a hung file system): it may land later.
    public func retire(waitingAtMost limit: Duration) -> Bool {
        let deadline = ContinuousClock.now.advanced(by: limit)
        gate.withLock { $0.retired = true }
        while gate.withLock({ $0.renaming }) {
            guard ContinuousClock.now < deadline else { return false }
            usleep(1_000)
        }
        return true
    }

    /// Removes the temporary files of this file that an earlier run left behind (a crash between
    /// create and rename): the regular files named `.{name}.tmp-{digits}-{digits}`, whichever
    /// process made them. Links (never followed), directories and other names are left alone.
    /// Call it before the first write: a write under way would lose its temporary file.
    ///
    /// - Returns: how many were removed, and the first failure, if any (the others are still tried).
    public func removeLeftovers() -> (removed: Int, error: FileWriteError?) {
        // A descriptor of its own: reading entries moves its offset.
        let fd = openat(directory.descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return (0, .system("open", directory.path, errno)) }
        guard let stream = fdopendir(fd) else {
            let code = errno
            _ = Glibc.close(fd)
            return (0, .system("fdopendir", directory.path, code))
        }
        var names: [[CChar]] = []
        var failure: FileWriteError?
        while true {
            errno = 0
            guard let entry = readdir(stream) else {
                if errno != 0 { failure = .system("readdir", directory.path, errno) }
                break
            }
            let bytes = withUnsafeBytes(of: &entry.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
            if isLeftover(bytes) { names.append(bytes.map { CChar(bitPattern: $0) } + [0]) }
        }
        // Closes fd too; nothing to do about a failed close of a directory only read.
        _ = closedir(stream)
        var removed = 0
        for name in names {
            let shown = inDirectory(String(decoding: name.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self))
            var status = stat()
            guard fstatat(directory.descriptor, name, &status, AT_SYMLINK_NOFOLLOW) == 0 else {
                if errno != ENOENT, failure == nil { failure = .system("stat", shown, errno) }
                continue
            }
            guard status.st_mode & S_IFMT == S_IFREG else { continue }
            // unlinkat never follows a link: should the name have become one meanwhile, the link goes.
            guard unlinkat(directory.descriptor, name, 0) == 0 else {
                if errno != ENOENT, failure == nil { failure = .system("unlink", shown, errno) }
                continue
            }
            removed += 1
        }
        return (removed, failure)
    }

    /// Removes the file (a name that has become a link loses the link, never its target); a file
    /// already gone is no failure. Not synced: should a crash undo the removal, the file is back
    /// as it was.
    public func remove() -> FileWriteError? {
        guard unlinkat(directory.descriptor, name, 0) == 0 || errno == ENOENT else {
            return .system("unlink", path, errno)
        }
        let held = gate.withLock { gate in
            defer {
                gate.written = nil
                gate.changes &+= 1
            }
            return gate.written?.descriptor
        }
        if let held { _ = Glibc.close(held) }
        return nil
    }

    /// Whether `name` is `.{name}.tmp-{digits}-{digits}`.
    private func isLeftover(_ name: [UInt8]) -> Bool {
        guard name.count > leftoverPrefix.count, name.starts(with: leftoverPrefix) else { return false }
        let numbers = name[leftoverPrefix.count...].split(
            separator: UInt8(ascii: "-"), omittingEmptySubsequences: false)
        return numbers.count == 2
            && numbers.allSatisfy { !$0.isEmpty && $0.allSatisfy { (0x30...0x39).contains($0) } }
    }

    /// Creates a new temporary file, trying the next number when one is already taken: its name
    /// in the directory, and its descriptor.
    private func createTemporary() -> Result<(String, Int32), FileWriteError> {
        var lastError: FileWriteError?
        for _ in 0..<Self.maximumAttempts {
            let number = counter.withLock { counter -> UInt64 in
                counter &+= 1
                return counter
            }
            let temporary = temporaryName(number)
            let fd = openat(
                directory.descriptor, temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode_t(mode))
            if fd >= 0 { return .success((temporary, fd)) }
            let code = errno
            lastError = .system("open", inDirectory(temporary), code)
            // Taken (a leftover, or anything planted there): never reused, never followed; try another name.
            guard code == EEXIST || code == EINTR else { break }
        }
        return .failure(lastError ?? .system("open", temporaryPath(0), EEXIST))
    }

    /// Writes all of `bytes`, continuing after short writes and retrying after `EINTR`.
    private static func writeAll(_ bytes: [UInt8], to fd: Int32, path: String) -> FileWriteError? {
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if written < 0 {
                if errno == EINTR { continue }
                return .system("write", path, errno)
            }
            // write(2) returns 0 for a non-empty buffer only when it cannot go on (a full device
            // that says so this way): looping would spin.
            guard written > 0 else { return .system("write", path, EIO) }
            offset += written
        }
        return nil
    }

    /// `fsync`, retried after `EINTR`.
    private static func sync(_ fd: Int32, path: String) -> FileWriteError? {
        while fsync(fd) != 0 {
            if errno == EINTR { continue }
            return .system("fsync", path, errno)
        }
        return nil
    }
}

/// Why a token file was not written: the call that failed, on which path, and the system's reason.
///
/// Printed as `rename /run/tb/default.token: Permission denied`.
public struct FileWriteError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The system call that failed, such as `open` or `rename`.
    public let call: String
    /// The path it was called on.
    public let path: String
    /// The `errno` it failed with.
    public let code: Int32
    /// Removing the temporary file after the failure failed too: why, in words.
    public private(set) var cleanupProblem: String?

    public init(call: String, path: String, code: Int32) {
        self.call = call
        self.path = path
        self.code = code
    }

    static func system(_ call: String, _ path: String, _ code: Int32) -> Self {
        Self(call: call, path: path, code: code)
    }

    /// A write abandoned before its rename because its writer was retired (`AtomicFileWriter.retire(waitingAtMost:)`).
    static func abandoned(_ path: String) -> Self { Self(call: "rename", path: path, code: ECANCELED) }

    /// Whether the write was abandoned because its writer was retired, not failed by the system.
    public var isAbandoned: Bool { call == "rename" && code == ECANCELED }

    func addingCleanupFailure(unlink path: String, _ code: Int32) -> Self {
        var error = self
        error.cleanupProblem = "unlink \(path): \(String(cString: strerror(code)))"
        return error
    }

    /// The system's text for `code`, such as `Permission denied`.
    public var reason: String { String(cString: strerror(code)) }

    public var description: String {
        "\(call) \(path): \(reason)" + (cleanupProblem.map { "; then \($0)" } ?? "")
    }
}
