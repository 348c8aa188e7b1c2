import Glibc

/// Reads whole files with the system's `open` and `read`, without Foundation.
public enum FileContents {
    /// The file's bytes, or the system's reason it could not be read (such as `No such file or directory`).
    public static func read(_ path: String, limit: Int = 64 << 20) -> Result<[UInt8], FileReadError> {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return .failure(FileReadError(reason: String(cString: strerror(errno)))) }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return .failure(FileReadError(reason: String(cString: strerror(errno))))
            }
            if count == 0 { return .success(bytes) }
            bytes.append(contentsOf: buffer[0..<count])
            guard bytes.count <= limit else { return .failure(FileReadError(reason: "larger than \(limit) bytes")) }
        }
    }
}

public struct FileReadError: Error, Sendable, CustomStringConvertible {
    public let reason: String
    public var description: String { reason }
}
