import Glibc
import TokenBrokerCore

/// Reads key and secret files, through `FileContents`: never waiting on a FIFO or a device.
public enum SecretFile {
    /// The largest key or secret file read when no other limit is given: 1 MiB, far above any
    /// PEM key or secret.
    public static let defaultLimit = 1 << 20

    /// The file's bytes; a file that cannot be read, is not a regular file, or is larger than
    /// `limit` is a `configuration` error naming the path.
    public static func read(_ path: String, limit: Int = defaultLimit) throws(TokenFetchError) -> [UInt8] {
        switch FileContents.read(path, limit: limit) {
        case .success(let bytes): return bytes
        case .failure(let error): throw .configuration("cannot read \(path): \(error.reason)")
        }
    }

    /// A secret written as one line of UTF-8, such as a client secret or an API key; trailing
    /// line breaks (which `echo` and editors add) are dropped.
    public static func readLine(_ path: String) throws(TokenFetchError) -> String {
        var bytes = try read(path)
        while let last = bytes.last, last == 0x0A || last == 0x0D { bytes.removeLast() }
        guard !bytes.isEmpty, let text = String(validating: bytes, as: UTF8.self), !text.contains(where: \.isNewline)
        else {
            throw .configuration("\(path) must hold one non-empty line of UTF-8")
        }
        return text
    }

    /// Checks, at start, `--check-config` and reload, a one-line secret file that is read again
    /// at every fetch (a `clientSecretFile`): nothing at the path is accepted, since a mounted
    /// secret may appear later, but anything that is there must read as `readLine` reads it. A
    /// FIFO, a device, a directory, a symbolic link that leads nowhere, an unreadable or empty
    /// file is a `configuration` error naming the path, not a failure at every fetch.
    public static func checkLine(_ path: String) throws(TokenFetchError) {
        if case .failure(let error) = FileContents.read(path), error.isMissing {
            var status = stat()
            guard lstat(path, &status) == 0 else { return }
            throw .configuration("cannot read \(path): a symbolic link that leads nowhere (\(error.reason))")
        }
        _ = try readLine(path)
    }
}
