import Glibc
import TokenBrokerCore

/// The start-up check of a token file's place: the broker refuses to start (exit 2, invalid
/// configuration) with the reason this gives.
///
/// The directory must exist and be a directory (the broker makes none: a missing one is more
/// likely a typo than a wish), and must not be writable by others: whoever can write there can
/// replace the token file with one of their own, or remove it, between two writes. The sticky
/// bit does not help (it stops others from renaming over the broker's file, not from planting
/// files), so `/tmp` is refused too. The path itself may not be a directory, which no rename can
/// replace. Symbolic links are followed for the directory, as `open` would; the file's own name,
/// if a symbolic link, is replaced by the first write, never followed.
public enum SinkDirectory {
    /// Why `path`'s directory cannot hold a token file, or nil when it can.
    public static func problem(for path: String) -> String? {
        let directory = BrokerConfiguration.directory(of: path)
        var status = stat()
        guard stat(directory, &status) == 0 else {
            let code = errno
            return code == ENOENT
                ? "the directory \(directory) does not exist; create it (owned by the broker's user, mode 0700 or 0750)"
                : "the directory \(directory) cannot be examined: \(String(cString: strerror(code)))"
        }
        guard status.st_mode & S_IFMT == S_IFDIR else {
            return "\(directory) is not a directory"
        }
        guard status.st_mode & S_IWOTH == 0 else {
            let mode = "0" + String(status.st_mode & 0o7777, radix: 8)
            return "the directory \(directory) is writable by other users (mode \(mode)): they could replace "
                + "or remove the token file; allowed: a directory only its owner and group can write, such as mode 0750"
        }
        var existing = stat()
        if lstat(path, &existing) == 0, existing.st_mode & S_IFMT == S_IFDIR {
            return "\(path) is a directory; allowed: the path of a file (it is created if missing)"
        }
        return nil
    }
}
