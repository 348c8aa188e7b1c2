import Glibc

/// Reads whole regular files with the system's `open`, `fstat` and `read`, without Foundation.
///
/// Every file the broker reads (its configuration, keys, secrets, caller keys, token files) comes
/// through here, and none of these reads may wait: they run on Swift's cooperative pool, where
/// one stuck read takes a thread from every provider. So the file is opened with `O_NONBLOCK`
/// (opening a FIFO then returns at once instead of waiting for a writer) and `O_NOCTTY`; the
/// opened descriptor, not the path, is checked with `fstat`, and only a regular file is read (a
/// FIFO, a device, a directory or a socket is refused); and the size is checked against `limit`
/// before reading, then reading stops at `limit + 1` bytes, so a file that grows meanwhile costs
/// no more memory than the limit either.
public enum FileContents {
    /// The limit when none is given: 4 MiB, room for any configuration or key file.
    public static let defaultLimit = 4 << 20

    /// The file's bytes, or why it could not be read (such as `No such file or directory`).
    /// - Parameter limit: the largest size accepted, in bytes.
    public static func read(_ path: String, limit: Int = defaultLimit) -> Result<[UInt8], FileReadError> {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
        guard fd >= 0 else { return .failure(.system(errno)) }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { return .failure(.system(errno)) }
        guard status.st_mode & S_IFMT == S_IFREG else {
            return .failure(.notRegular(FileReadError.kind(of: status.st_mode)))
        }
        guard status.st_size <= limit else { return .failure(.tooLarge(limit)) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Int(status.st_size) + 1)
        var buffer = [UInt8](repeating: 0, count: min(64 * 1024, limit + 1))
        while true {
            // Never more than one byte past the limit, however large the file has grown.
            let wanted = min(buffer.count, limit + 1 - bytes.count)
            let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, wanted) }
            if count < 0 {
                if errno == EINTR { continue }
                return .failure(.system(errno))
            }
            if count == 0 { return .success(bytes) }
            bytes.append(contentsOf: buffer[0..<count])
            guard bytes.count <= limit else { return .failure(.tooLarge(limit)) }
        }
    }
}

/// Why a file could not be read: the system's reason, a file that is not a regular one, or one too large.
public struct FileReadError: Error, Sendable, Equatable, CustomStringConvertible {
    private enum Code: Sendable, Equatable { case system, missing, notRegular, tooLarge }

    private let code: Code
    /// What went wrong, in words, such as `is a FIFO, not a regular file`.
    public let reason: String

    private init(_ code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// The system refused: `open`, `fstat` or `read` failed with `error`.
    static func system(_ error: Int32) -> Self {
        .init(error == ENOENT ? .missing : .system, String(cString: strerror(error)))
    }
    /// The path names something other than a regular file; `kind` says what.
    static func notRegular(_ kind: String) -> Self { .init(.notRegular, "is \(kind), not a regular file") }
    /// The file is larger than `limit` bytes.
    static func tooLarge(_ limit: Int) -> Self { .init(.tooLarge, "is larger than \(limit) bytes") }

    /// Nothing is at the path (`ENOENT`).
    public var isMissing: Bool { code == .missing }
    /// The file is larger than the limit.
    public var isTooLarge: Bool { code == .tooLarge }
    /// The path names a FIFO, a device, a directory or a socket.
    public var isNotRegular: Bool { code == .notRegular }
    public var description: String { reason }

    /// What a file mode's type is, in words.
    static func kind(of mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFIFO: "a FIFO"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        case S_IFDIR: "a directory"
        case S_IFSOCK: "a socket"
        case S_IFLNK: "a symbolic link"
        default: "of an unknown type"
        }
    }
}
