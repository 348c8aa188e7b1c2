import Glibc
import TokenBrokerCore
import TokenBrokerCrypto

/// A file by its device and inode.
struct FileID: Equatable {
    let device: UInt64
    let inode: UInt64

    init(_ status: stat) { (device, inode) = (UInt64(status.st_dev), UInt64(status.st_ino)) }
}

/// The file a writer answers for at its path (`AtomicFileWriter`): the one its last write renamed
/// there, or one it took as its own since because it holds the same (another writer of the same
/// file, such as a second broker, wrote it), held open so that its inode cannot be reused, with
/// what it was made with: its owner, group and mode, and the size and SHA-256 of its contents.
///
/// The contents are kept by their digest only: no copy of a token, and 32 bytes for a store
/// record of up to 256 KiB.
struct HeldFile {
    let id: FileID
    /// Open for reading (the writer's own file is created `O_RDWR`), closed by whoever drops it.
    let descriptor: Int32
    let owner: uid_t
    let group: gid_t
    /// The permission bits, with the set-id and sticky bits.
    let mode: mode_t
    let size: Int
    /// The SHA-256 of the contents; nil when OpenSSL could not compute it, when nothing can be
    /// compared: the file is then never taken for another, nor found changed in place.
    let digest: [UInt8]?

    /// The file of `status`, open as `descriptor`, holding `size` bytes of SHA-256 `digest`.
    init(_ status: stat, descriptor: Int32, size: Int, digest: [UInt8]?) {
        id = FileID(status)
        self.descriptor = descriptor
        (owner, group, mode) = (status.st_uid, status.st_gid, status.st_mode & 0o7777)
        self.size = size
        self.digest = digest
    }

    /// The digest a held file keeps of `bytes`.
    static func digest(of bytes: [UInt8]) -> [UInt8]? { try? Crypto.sha256(bytes) }

    /// Whether `status` is a regular file made as this one was: the same owner, group, mode and size.
    func isMadeAlike(_ status: stat) -> Bool {
        status.st_mode & S_IFMT == S_IFREG && status.st_uid == owner && status.st_gid == group
            && status.st_mode & 0o7777 == mode && Int(status.st_size) == size
    }

    /// Whether the file open as `descriptor` (this file, or another) holds exactly what this one
    /// was written with, read from its start: at most `size` + 1 bytes, so that a file grown since
    /// is read no further. Nil, with `errno` set, when it cannot be read; false when no digest was kept.
    func holdsTheSame(_ descriptor: Int32) -> Bool? {
        guard let digest else { return false }
        var bytes = [UInt8](repeating: 0, count: size + 1)
        var count = 0
        while count < bytes.count {
            let read = bytes.withUnsafeMutableBytes {
                pread(descriptor, $0.baseAddress! + count, $0.count - count, count)
            }
            if read < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if read == 0 { break }
            count += read
        }
        return count == size && Self.digest(of: Array(bytes.prefix(count))) == digest
    }

    /// The file now at `name` in the directory open as `directory`, open, when it is made as
    /// `held` was (`isMadeAlike`) and holds what it holds: another writer's copy of the same
    /// contents, which readers of the path read as they would read `held`. Nil otherwise.
    ///
    /// Opened `O_RDONLY | O_NOFOLLOW | O_NONBLOCK`, only once `status` (the path's, not following
    /// a link) says it is such a file, and checked again through the descriptor: no link is
    /// followed, no FIFO or lease holds the open up, and only a file of the writer's own user
    /// (or root's making) is ever opened, since no other user can make one.
    static func copy(of held: HeldFile, at name: String, in directory: Int32, status: stat) -> HeldFile? {
        guard held.isMadeAlike(status) else { return nil }
        let descriptor = openat(directory, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        var opened = stat()
        guard fstat(descriptor, &opened) == 0, held.isMadeAlike(opened), held.holdsTheSame(descriptor) == true else {
            _ = Glibc.close(descriptor)
            return nil
        }
        return HeldFile(opened, descriptor: descriptor, size: held.size, digest: held.digest)
    }
}
