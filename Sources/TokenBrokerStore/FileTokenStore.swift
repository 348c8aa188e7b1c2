import Dispatch
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSinks

/// The `file` store: each provider's token in a file of its own in one directory, sealed
/// (`StoreRecord`), so that a broker started again serves it without fetching.
///
/// - The directory is checked and opened once at start, as a token file's is (`SinkDirectory`:
///   it must exist, belong to the broker's user or root, and not be writable by others).
/// - A record's file is named by the SHA-256 of its key (`StoreSlot.key`), in hexadecimal, with
///   `.record`: no provider name or value reaches a path.
/// - Writes are atomic and durable (`AtomicFileWriter`: a temporary file, `fsync`, `rename`,
///   mode 0600) and run on the store's own queue, in order, never on the caller's thread.
/// - Reads go through `FileContents`, which never waits on a FIFO or reads past `maximumSize`.
public final class FileTokenStore: TokenStore {
    /// What the store reports of its writes, for logs and metrics: the key, and the problem when one failed.
    public typealias SaveReport = @Sendable (_ key: String, _ problem: String?) -> Void

    /// The directory, as opened at start.
    public let directory: SinkDirectory
    private let record: StoreRecord
    private let onSave: SaveReport
    private let queue = DispatchQueue(label: "token-broker.store.file")
    /// One writer per key, made at its first write (and its leftovers removed then).
    private let writers = Lock<[String: AtomicFileWriter]>([:])

    /// A store in `directory`, sealing with `cipher`.
    public init(directory: SinkDirectory, cipher: AESGCM, onSave: @escaping SaveReport = { _, _ in }) {
        self.directory = directory
        record = StoreRecord(cipher: cipher)
        self.onSave = onSave
    }

    /// The file of the record kept under `key`, in the store's directory.
    /// (Should SHA-256 ever fail, every key shares one file, `.record`, whose records then fail
    /// to authenticate under any other key: refused, never served to the wrong provider.)
    public func path(for key: String) -> String {
        let name = (try? Fingerprint.sha256Hex(key)) ?? ""
        return directory.path + (directory.path.hasSuffix("/") ? "" : "/") + name + ".record"
    }

    public func load(_ key: String) async -> StoreLoad {
        switch FileContents.read(path(for: key), limit: StoreRecord.maximumSize) {
        case .failure(let error) where error.isMissing: return .missing
        case .failure(let error): return .refused("cannot read \(path(for: key)): \(error)")
        case .success(let bytes):
            switch record.open(bytes, key: key) {
            case .success(let token): return .found(token)
            case .failure(let problem): return .refused("\(path(for: key)) \(problem)")
            }
        }
    }

    public func save(_ key: String, _ token: StoredToken) {
        queue.async { [self] in
            let sealed: [UInt8]
            do throws(TokenFetchError) {
                sealed = try record.seal(token, key: key)
            } catch {
                onSave(key, error.summary)
                return
            }
            switch writer(for: key).write(sealed) {
            case .success: onSave(key, nil)
            case .failure(let error): onSave(key, error.description)
            }
        }
    }

    /// Waits until every write handed to the store has ended; for the broker's stop.
    public func flush() { queue.sync {} }

    private func writer(for key: String) -> AtomicFileWriter {
        writers.withLock { writers in
            if let writer = writers[key] { return writer }
            let writer = AtomicFileWriter(directory: directory, path: path(for: key), mode: 0o600)
            _ = writer.removeLeftovers()
            writers[key] = writer
            return writer
        }
    }
}
