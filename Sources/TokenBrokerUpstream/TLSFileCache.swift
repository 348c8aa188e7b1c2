import Glibc
import TokenBrokerCore

/// The TLS files of issuers and proxy targets (`caFile`, `clientCertFile`, `clientKeyFile`) as a
/// loop hands them to libcurl: as bytes (`CURLOPT_CAINFO_BLOB` and the like), never as paths.
///
/// Given a path, libcurl and OpenSSL open the file themselves at each new connection, with a
/// blocking `open` on the loop's thread: a file replaced by a FIFO after it was checked held the
/// thread there, and with it every exchange of the loop (every issuer's, on the first loop) and
/// the broker's exit. So the loop reads them here, as every other file is read (`FileContents`:
/// a regular file, within a size limit, never waited on), and reads one again only when `stat`
/// says it changed (another file at the path, or another size, modification or change time): a
/// replaced file is used from the next request on, without a CA bundle of hundreds of KiB read
/// again for every proxied request.
///
/// A loop's own: only its thread uses it.
final class TLSFileCache {
    /// What `stat` says of a file, enough to tell that it changed.
    private struct Identity: Equatable {
        var device: UInt64
        var inode: UInt64
        var size: Int64
        var modified: (seconds: Int, nanoseconds: Int)
        var changed: (seconds: Int, nanoseconds: Int)

        init(_ status: stat) {
            device = UInt64(status.st_dev)
            inode = UInt64(status.st_ino)
            size = Int64(status.st_size)
            modified = (status.st_mtim.tv_sec, status.st_mtim.tv_nsec)
            changed = (status.st_ctim.tv_sec, status.st_ctim.tv_nsec)
        }

        static func == (a: Self, b: Self) -> Bool {
            a.device == b.device && a.inode == b.inode && a.size == b.size && a.modified == b.modified
                && a.changed == b.changed
        }
    }

    private var entries: [String: (identity: Identity, bytes: [UInt8])] = [:]
    /// The most files kept: far more than a configuration names; past it (paths left behind by
    /// reloads), the cache starts again empty.
    static let entryLimit = 64

    /// The file's bytes, read again only when it changed since the last read; or why it cannot
    /// be read, as `FileContents` says.
    func contents(of path: String, limit: Int) -> Result<[UInt8], FileReadError> {
        var status = stat()
        let identity = stat(path, &status) == 0 ? Identity(status) : nil
        if let identity, let entry = entries[path], entry.identity == identity { return .success(entry.bytes) }
        // Read again: the file changed, or is new to the cache. A file replaced between `stat`
        // and the read is kept under the older identity, and read again at the next request.
        let result = FileContents.read(path, limit: limit)
        if case .success(let bytes) = result, let identity {
            if entries[path] == nil, entries.count >= Self.entryLimit { entries = [:] }
            entries[path] = (identity, bytes)
        } else {
            entries[path] = nil
        }
        return result
    }
}
