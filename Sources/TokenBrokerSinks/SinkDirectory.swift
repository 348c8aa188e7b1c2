internal import CSystem
import Glibc
import TokenBrokerCore

/// A token file's directory, checked and opened once at start: the broker refuses to start
/// (exit 2, invalid configuration) with the reason `open` gives, and writes every token file
/// through the descriptor it keeps (`AtomicFileWriter`), never through the path again, so that a
/// directory renamed or replaced later cannot redirect a write.
///
/// The directory must exist and be a directory (the broker makes none: a missing one is more
/// likely a typo than a wish), and:
/// - be owned by the broker's effective user or by root: its owner can replace the token file;
/// - not be writable by others: whoever can write there can replace the token file with one of
///   their own, or remove it, between two writes. The sticky bit does not help (it stops others
///   from renaming over the broker's file, not from planting files), so `/tmp` is refused too;
/// - have no directory on the path to it, from `/`, that another user owns, or that others can
///   write (by its mode, or by an ACL entry naming another user or a group) unless it has the
///   sticky bit (as `/tmp`): whoever owns or can write such a directory can rename the directory
///   away and put one of their own in its place, which readers of the path would then read while
///   the broker goes on writing into the one renamed.
///
/// The path is walked as written, one name at a time from `/` (a relative path from the working
/// directory), each directory opened from the one before without following links, so that what
/// is checked is what is opened. A symbolic link on the way is followed by hand: the directory
/// that holds it is checked as every directory on the way is, since whoever could replace a
/// directory there could replace the link just as well, and so are the directories its target
/// leads through; the link itself must be owned by the broker's user or root, since its owner
/// may replace it even in a sticky directory. Checking only the directories above the resolved
/// path (`realpath`) would let the owner of a directory that holds a link repoint it. The
/// file's own name, if a symbolic link, is replaced by the first write, never followed.
///
/// Opened trusting its writers (`SinkConfiguration.trustDirectoryWriters`, for a Kubernetes
/// `emptyDir` shared by a pod's containers, mode 0777), others may write the directory and
/// the directories above it, by their mode or by an ACL entry: those two checks, and only
/// those, become notes (`otherWriters`) that the broker logs as a warning; and since any of
/// those writers can make a directory at the file's path, that is a warning too
/// (`plantedEntry(for:)`), not a refusal (`fileProblem(for:)`). Every other check stays, and so
/// does the way each write is made (`AtomicFileWriter`): a new file created exclusively, never
/// following a link, written through the descriptor opened here and renamed over the path.
public final class SinkDirectory: Sendable {
    /// The directory as the configuration names it, for messages.
    public let path: String
    /// The directory with symbolic links and `.`, `..` resolved, as `open` walked to it.
    public let resolvedPath: String
    /// Open (`O_RDONLY | O_DIRECTORY | O_CLOEXEC`) for the life of this object; closed by `deinit`.
    public let descriptor: Int32
    /// The directory's device and inode, which name it whatever path leads there.
    public let device: UInt64
    public let inode: UInt64
    /// Whether it was opened trusting whoever may write it and the directories above it
    /// (`open(_:trustingWriters:)`).
    public let trustsWriters: Bool
    /// What others may write, found by `open` and let through because it trusts the writers, in
    /// path order: `/shared (mode 0777)`, `/data, a directory above, lets user 4242 write it (an
    /// ACL entry)`. Empty when the directory was not opened trusting its writers, or when nobody
    /// else may write there now.
    public let otherWriters: [String]

    private init(
        path: String, resolvedPath: String, descriptor: Int32, status: stat, trustsWriters: Bool,
        otherWriters: [String]
    ) {
        self.path = path
        self.resolvedPath = resolvedPath
        self.descriptor = descriptor
        device = UInt64(status.st_dev)
        inode = UInt64(status.st_ino)
        self.trustsWriters = trustsWriters
        self.otherWriters = otherWriters
    }

    deinit {
        // Nothing to do about a failed close of a directory only read.
        _ = Glibc.close(descriptor)
    }

    /// What names one file in one directory, whatever path (`..`, symbolic links) leads there:
    /// two sinks with the same identity would write the same file.
    public struct FileIdentity: Hashable, Sendable {
        public let device: UInt64
        public let inode: UInt64
        public let name: String

        /// The file `name` in the directory of `device` and `inode`.
        public init(device: UInt64, inode: UInt64, name: String) {
            (self.device, self.inode, self.name) = (device, inode, name)
        }
    }

    /// The identity of the file `name` in this directory.
    public func identity(of name: String) -> FileIdentity {
        FileIdentity(device: device, inode: inode, name: name)
    }

    /// Why the directory that `path` names now is not this one, or nil while it is: since it was
    /// opened, it was renamed away, replaced or removed, or a symbolic link on the way was
    /// repointed. Writes still go to this one (`AtomicFileWriter`), where readers that open the
    /// file by its path no longer look.
    public func replacementProblem() -> String? {
        var status = stat()
        guard stat(path, &status) == 0 else {
            let reason = String(cString: strerror(errno))
            return "the directory \(path) cannot be examined now (\(reason)): the file is written into the"
                + " directory opened at start, where readers of the path may no longer look"
        }
        guard UInt64(status.st_dev) == device, UInt64(status.st_ino) == inode else {
            return "the directory \(path) was renamed or replaced since the broker opened it: the file is"
                + " written into the directory opened then, where readers of the path no longer look;"
                + " a restart, or a reload that changes the token files, opens the one now at the path"
        }
        return nil
    }

    /// Why `path`'s directory cannot hold a token file, or nil when it can; the directory is
    /// opened and checked (`open(_:trustingWriters:)`) then closed again.
    public static func problem(for path: String, trustingWriters: Bool = false) -> String? {
        switch open(BrokerConfiguration.directory(of: path), trustingWriters: trustingWriters) {
        case .failure(let problem): return problem.description
        case .success(let directory): return directory.fileProblem(for: path)
        }
    }

    /// Why the file `path` (in this directory) cannot be a token file, or nil: its name, and the
    /// name of each temporary file a write makes beside it, must fit the directory's file system
    /// (NAME_MAX, 255 bytes, on most), or every write would fail; and it must not be a
    /// directory, which no rename can replace, unless the directory was opened trusting its
    /// writers: any of them could make one there, and so stop every start and reload; such a
    /// directory is then a warning (`plantedEntry(for:)`), and each write fails until it is gone.
    public func fileProblem(for path: String) -> String? {
        let name = AtomicFileWriter.fileName(of: path)
        let limit = fpathconf(descriptor, Int32(_PC_NAME_MAX))
        let longest = limit > 0 ? limit : Int(NAME_MAX)
        if name.utf8.count > longest {
            return "the file name of \(path) is \(name.utf8.count) bytes long; allowed: at most \(longest) "
                + "(the directory's file system allows no longer names)"
        }
        let temporary = AtomicFileWriter.longestTemporaryName(for: name)
        if temporary > longest {
            return "the temporary files of \(path) would have names of up to \(temporary) bytes; allowed: at "
                + "most \(longest) (the directory's file system allows no longer names): a shorter file name"
        }
        var existing = stat()
        if !trustsWriters, fstatat(descriptor, name, &existing, AT_SYMLINK_NOFOLLOW) == 0,
            existing.st_mode & S_IFMT == S_IFDIR
        {
            return "\(path) is a directory; allowed: the path of a file (it is created if missing)"
        }
        return nil
    }

    /// What is at the file `path` (in this directory) when it is not a file and the directory
    /// was opened trusting its writers, one of whom may have put it there, as a warning; else
    /// nil. A directory makes each write fail until it is removed; anything else (a symbolic
    /// link, a FIFO, a socket) the first write replaces, never following or opening it.
    public func plantedEntry(for path: String) -> String? {
        var existing = stat()
        guard trustsWriters,
            fstatat(descriptor, AtomicFileWriter.fileName(of: path), &existing, AT_SYMLINK_NOFOLLOW) == 0,
            existing.st_mode & S_IFMT != S_IFREG
        else { return nil }
        guard existing.st_mode & S_IFMT == S_IFDIR else {
            return "\(path) is \(Self.kind(of: existing)), not a file: the first write replaces it"
        }
        return "\(path) is a directory, which no write can replace: each write fails, is logged, counted and "
            + "tried again, and /readyz reports the file not ready, until it is removed"
    }

    /// What `status` is, as a noun for messages: `a file`, `a directory`, `a symbolic link`, …
    static func kind(of status: stat) -> String {
        switch status.st_mode & S_IFMT {
        case S_IFREG: return "a file"
        case S_IFDIR: return "a directory"
        case S_IFLNK: return "a symbolic link"
        case S_IFIFO: return "a FIFO"
        case S_IFSOCK: return "a socket"
        case S_IFCHR, S_IFBLK: return "a device"
        default: return "a special file"
        }
    }

    /// Why no file can be made in this directory, or nil when one can: a probe file,
    /// `.token-broker-probe-{random}`, is created (`O_CREAT | O_EXCL`, through the descriptor,
    /// never following a link) and removed at once; a random name, since a process id repeats
    /// (1 in every container) and probes a crash left behind must not block the next start. The owner and mode checks of `open` say
    /// nothing of this: `/proc`, a read-only mount, a full or foreign file system pass them, and
    /// every write would then fail. `what` names the files in the problem.
    public func creationProblem(holding what: String) -> String? {
        for _ in 0..<8 {
            let name = ".token-broker-probe-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
            let probe = openat(descriptor, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard probe >= 0 else {
                let code = errno
                // A probe a crash left behind: another name.
                if code == EEXIST { continue }
                return "the directory \(path) cannot hold a \(what): a file cannot be created there: "
                    + String(cString: strerror(code))
            }
            _ = Glibc.close(probe)
            guard unlinkat(descriptor, name, 0) == 0 else {
                return "the directory \(path) cannot hold a \(what): the probe file \(name) cannot be removed: "
                    + String(cString: strerror(errno))
            }
            return nil
        }
        return "the directory \(path) cannot hold a \(what): 8 probe files with random names already existed"
    }

    /// Opens `directory` after checking it and every directory on the path to it (see the type's
    /// note); else the reason it cannot hold a token file.
    ///
    /// - Parameter trustingWriters: let other users write it, and the directories above it (by
    ///   their mode or an ACL entry), noting each in `otherWriters` instead of refusing it.
    public static func open(_ directory: String, trustingWriters: Bool = false) -> Result<
        SinkDirectory, SinkDirectoryProblem
    > {
        // The path as written, from `/`: a relative one from the working directory, whose path
        // (`getcwd`) has no symbolic links. Next component last.
        var pending: [String]
        if directory.hasPrefix("/") {
            pending = components(of: directory).reversed()
        } else {
            guard let working = getcwd(nil, 0) else { return .failure(unexaminable(directory, ".", errno)) }
            pending = (components(of: String(cString: working)) + components(of: directory)).reversed()
            free(working)
        }
        let root = Glibc.open("/", openPathOnly | O_DIRECTORY | O_CLOEXEC)
        guard root >= 0 else { return .failure(unexaminable(directory, "/", errno)) }
        // The directories walked through from `/`, each opened from the one before without
        // following links, and whether it has been checked as a directory above the sink's.
        var walked: [(descriptor: Int32, path: String, checked: Bool)] = [(root, "/", false)]
        defer { for step in walked { _ = Glibc.close(step.descriptor) } }
        var linksFollowed = 0
        // What others may write on the way, when trusted.
        var writers: [String] = []
        while let component = pending.popLast() {
            if component == "." { continue }
            if component == ".." {
                // What `..` is to the kernel: the directory this one was reached from (`/` stays).
                if walked.count > 1 { _ = Glibc.close(walked.removeLast().descriptor) }
                continue
            }
            let holder = walked[walked.count - 1]
            // Whatever it holds on the way, a directory or a link, its owner or writers could replace.
            if !holder.checked {
                var status = stat()
                guard fstat(holder.descriptor, &status) == 0 else {
                    return .failure(unexaminable(directory, holder.path, errno))
                }
                switch ancestorWriters(holder.path, holder.descriptor, status, below: directory) {
                case .failure(let problem): return .failure(problem)
                case .success(let found?) where trustingWriters: writers.append(found.note)
                case .success(let found?): return .failure(found.problem)
                case .success(nil): break
                }
                walked[walked.count - 1].checked = true
            }
            let path = holder.path == "/" ? "/" + component : holder.path + "/" + component
            var status = stat()
            guard fstatat(holder.descriptor, component, &status, AT_SYMLINK_NOFOLLOW) == 0 else {
                return .failure(missing(directory, path, errno))
            }
            if status.st_mode & S_IFMT == S_IFLNK {
                linksFollowed += 1
                guard linksFollowed <= maximumLinks else { return .failure(unexaminable(directory, path, ELOOP)) }
                if let problem = linkProblem(path, status, below: directory) { return .failure(problem) }
                guard let target = readLink(holder.descriptor, component) else {
                    return .failure(unexaminable(directory, path, errno))
                }
                guard !target.isEmpty else { return .failure(missing(directory, path, ENOENT)) }
                if target.hasPrefix("/") {
                    for step in walked.dropFirst() { _ = Glibc.close(step.descriptor) }
                    walked.removeSubrange(1...)
                }
                pending += components(of: target).reversed()
                continue
            }
            guard status.st_mode & S_IFMT == S_IFDIR else {
                return .failure(SinkDirectoryProblem("\(directory) is not a directory"))
            }
            let next = openat(holder.descriptor, component, openPathOnly | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            // Anything but success (ELOOP, ENOTDIR: a link or a file where a directory was a
            // moment ago) means the path changed meanwhile.
            guard next >= 0 else { return .failure(unexaminable(directory, path, errno)) }
            walked.append((next, path, false))
        }
        let last = walked[walked.count - 1]
        // The walk opened it for `fstat` and lookups only; writes need a descriptor that can read it.
        let opened = openat(last.descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard opened >= 0 else { return .failure(unexaminable(directory, last.path, errno)) }
        var status = stat()
        guard fstat(opened, &status) == 0 else {
            let code = errno
            _ = Glibc.close(opened)
            return .failure(unexaminable(directory, last.path, code))
        }
        if let problem = ownerProblem(directory, status) {
            _ = Glibc.close(opened)
            return .failure(problem)
        }
        if status.st_mode & S_IWOTH != 0 {
            guard trustingWriters else {
                _ = Glibc.close(opened)
                return .failure(
                    SinkDirectoryProblem(
                        "the directory \(directory) is writable by other users (mode \(modeText(status))): they could "
                            + "replace or remove the token file; allowed: a directory only its owner and group can "
                            + "write, such as mode 0750",
                        trustWouldLift: true))
            }
            writers.append("\(directory) (mode \(modeText(status)))")
        }
        // The directory's own ACL writers are refused by the broker's ACL check, made once the
        // directory is open; trusted, they are noted here instead.
        if trustingWriters {
            switch aclWriter(of: opened) {
            case .failure(let failure):
                _ = Glibc.close(opened)
                return .failure(SinkDirectoryProblem("the directory \(directory) \(failure)"))
            case .success(let writer?): writers.append("\(directory) lets \(writer) write it (an ACL entry)")
            case .success(nil): break
            }
        }
        return .success(
            SinkDirectory(
                path: directory, resolvedPath: last.path, descriptor: opened, status: status,
                trustsWriters: trustingWriters, otherWriters: writers))
    }

    /// The symbolic links `open` follows, at most, before it gives up as the kernel would (`ELOOP`).
    static let maximumLinks = 40

    /// The names in `path`, empty ones (`//`, a trailing `/`) left out.
    private static func components(of path: String) -> [String] {
        path.split(separator: "/").map(String.init)
    }

    /// The target of the link `name` in the directory open as `holder`; nil, with `errno` set, when it cannot be read.
    private static func readLink(_ holder: Int32, _ name: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = buffer.withUnsafeMutableBufferPointer { readlinkat(holder, name, $0.baseAddress!, $0.count) }
        guard count >= 0 else { return nil }
        guard count < buffer.count else {
            errno = ENAMETOOLONG
            return nil
        }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Why `path`, a step on the way to `directory`, could not be looked up: missing, or else as the system says.
    private static func missing(_ directory: String, _ path: String, _ code: Int32) -> SinkDirectoryProblem {
        guard code == ENOENT else { return unexaminable(directory, path, code) }
        return SinkDirectoryProblem(
            "the directory \(directory) does not exist; create it (owned by the broker's user, mode 0700 or 0750)")
    }

    /// The directory's own owner: the broker's user or root.
    private static func ownerProblem(_ directory: String, _ status: stat) -> SinkDirectoryProblem? {
        let user = geteuid()
        guard status.st_uid == user || status.st_uid == 0 else {
            return SinkDirectoryProblem(
                "the directory \(directory) is owned by user \(status.st_uid), neither the broker's user (\(user)) "
                    + "nor root: its owner could replace or remove the token file; allowed: a directory owned by "
                    + "the broker's user or root")
        }
        return nil
    }

    /// Another writer of a directory above the sink's: the problem it is without trust, and the
    /// note it becomes with it (`open(_:trustingWriters:)`).
    private struct AncestorWriter {
        let problem: SinkDirectoryProblem
        let note: String
    }

    /// A directory on the path to the sink's: a problem when another user owns it (trust or
    /// not); else whoever else may write it, by its mode or by an ACL entry, unless it is sticky;
    /// else nil.
    private static func ancestorWriters(
        _ ancestor: String, _ descriptor: Int32, _ status: stat, below directory: String
    ) -> Result<AncestorWriter?, SinkDirectoryProblem> {
        let user = geteuid()
        guard status.st_uid == user || status.st_uid == 0 else {
            // Its owner may rename what is in it whatever its mode, sticky or not.
            return .failure(
                SinkDirectoryProblem(
                    "\(ancestor), a directory above \(directory), is owned by user \(status.st_uid), neither the "
                        + "broker's user (\(user)) nor root: its owner could rename the token file's directory away "
                        + "and put one of their own in its place; allowed: directories above owned by the broker's user "
                        + "or root"))
        }
        // Others may write a sticky directory, but not rename what they do not own.
        guard status.st_mode & S_ISVTX == 0 else { return .success(nil) }
        let consequence =
            "without the sticky bit: they could rename the token file's directory away and put one of their own in "
            + "its place"
        if status.st_mode & S_IWOTH != 0 {
            return .success(
                AncestorWriter(
                    problem: SinkDirectoryProblem(
                        "\(ancestor), a directory above \(directory), is writable by other users (mode "
                            + "\(modeText(status))) \(consequence); allowed: directories above that others cannot write, "
                            + "or sticky ones such as /tmp",
                        trustWouldLift: true),
                    note: "\(ancestor), a directory above (mode \(modeText(status)))"))
        }
        switch aclWriter(of: descriptor) {
        case .failure(let failure):
            return .failure(SinkDirectoryProblem("\(ancestor), a directory above \(directory), \(failure)"))
        case .success(let writer?):
            return .success(
                AncestorWriter(
                    problem: SinkDirectoryProblem(
                        "\(ancestor), a directory above \(directory), lets \(writer) write it (an ACL entry) "
                            + "\(consequence); allowed: directories above that no other user or named group can write, "
                            + "or sticky ones",
                        trustWouldLift: true),
                    note: "\(ancestor), a directory above, lets \(writer) write it (an ACL entry)"))
        case .success(nil):
            return .success(nil)
        }
    }

    /// A symbolic link on the path to the sink's directory: owned by the broker's user or root.
    /// Its owner may remove it from a sticky directory, such as `/tmp`, and put a link elsewhere
    /// in its place; its directory is checked as the others on the way are.
    private static func linkProblem(_ link: String, _ status: stat, below directory: String) -> SinkDirectoryProblem? {
        let user = geteuid()
        guard status.st_uid != user, status.st_uid != 0 else { return nil }
        return SinkDirectoryProblem(
            "\(link), a symbolic link on the way to \(directory), is owned by user \(status.st_uid), neither the "
                + "broker's user (\(user)) nor root: its owner could replace it with a link to a directory of their "
                + "own; allowed: links owned by the broker's user or root")
    }

    /// Another writer that an access ACL names: a user other than the broker's, or a named group.
    public struct ACLWriter: Sendable, Equatable, CustomStringConvertible {
        /// A named group (`ACL_GROUP`), whose members are other users; else a named user (`ACL_USER`).
        public let isGroup: Bool
        public let id: UInt32

        /// `user 4242`, `group 4343`.
        public var description: String { (isGroup ? "group " : "user ") + String(id) }
    }

    /// Why an access ACL could not be read, as the end of a sentence about its directory.
    public struct ACLReadFailure: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
    }

    /// The first writer, besides the owner and the owning group, that the access ACL of the
    /// directory open as `descriptor` names, or nil (no ACL, or a file system without ACLs): a
    /// named user other than the broker's, or any named group, whose entry the ACL mask lets
    /// write. Their write permission shows in no mode bit (only the mask does, as the group
    /// bits). The ACL is read as the kernel stores it: version 2, then entries of tag,
    /// permissions and id, little-endian. A descriptor opened only as a path (`O_PATH`, as the
    /// directories above are, which need not be readable) has no extended attributes of its own
    /// (`EBADF`): it is then read through `/proc/self/fd`, which names the directory it holds.
    public static func aclWriter(of descriptor: Int32) -> Result<ACLWriter?, ACLReadFailure> {
        let name = "system.posix_acl_access"
        var value = [UInt8](repeating: 0, count: 4 + 8 * 256)
        var size = value.withUnsafeMutableBytes { fgetxattr(descriptor, name, $0.baseAddress, $0.count) }
        if size < 0, errno == EBADF {
            size = value.withUnsafeMutableBytes {
                getxattr("/proc/self/fd/\(descriptor)", name, $0.baseAddress, $0.count)
            }
        }
        guard size >= 0 else {
            let code = errno
            if code == ENODATA || code == ENOTSUP || code == EOPNOTSUPP { return .success(nil) }
            return .failure(
                ACLReadFailure(description: "cannot be examined for an ACL: \(String(cString: strerror(code)))"))
        }
        func field(_ offset: Int, _ width: Int) -> UInt32 {
            (0..<width).reduce(0) { $0 | UInt32(value[offset + $1]) << (8 * UInt32($1)) }
        }
        guard size >= 4, (size - 4) % 8 == 0, field(0, 4) == 2 else {
            return .failure(ACLReadFailure(description: "has an ACL this broker cannot read"))
        }
        let entries = stride(from: 4, to: size, by: 8).map {
            (tag: field($0, 2), permissions: field($0 + 2, 2), id: field($0 + 4, 4))
        }
        // ACL_MASK (0x10) bounds what named entries grant; without one, there are no named entries.
        let mask = entries.first { $0.tag == 0x10 }?.permissions ?? 7
        let user = geteuid()
        // ACL_USER (0x02): a named user; write is 2.
        if let writer = entries.first(where: { $0.tag == 0x02 && $0.permissions & mask & 2 != 0 && $0.id != user }) {
            return .success(ACLWriter(isGroup: false, id: writer.id))
        }
        // ACL_GROUP (0x08): a named group (the owning group is ACL_GROUP_OBJ, whose write
        // permission the mode's group bits show).
        if let writer = entries.first(where: { $0.tag == 0x08 && $0.permissions & mask & 2 != 0 }) {
            return .success(ACLWriter(isGroup: true, id: writer.id))
        }
        return .success(nil)
    }

    private static func unexaminable(_ directory: String, _ step: String, _ code: Int32) -> SinkDirectoryProblem {
        SinkDirectoryProblem(
            "the directory \(directory) cannot be examined: \(step): \(String(cString: strerror(code)))")
    }

    private static func modeText(_ status: stat) -> String { "0" + String(status.st_mode & 0o7777, radix: 8) }
}

/// `O_PATH` (Linux's value on x86_64 and arm64), which Glibc's Swift module leaves out: a
/// descriptor that names a directory without the right to read it, enough to `fstat` it and to
/// open what is in it; the directories above a token file's need not be readable.
private let openPathOnly: Int32 = 0o10_000_000

/// Why a directory cannot hold a token file, in words.
public struct SinkDirectoryProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
    /// Whether the problem is that others may write the directory or one above it, which opening
    /// it trusting its writers lets through (`SinkDirectory.open(_:trustingWriters:)`).
    public let trustWouldLift: Bool

    public init(_ description: String, trustWouldLift: Bool = false) {
        self.description = description
        self.trustWouldLift = trustWouldLift
    }
}
