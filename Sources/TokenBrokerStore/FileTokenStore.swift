import Dispatch
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSinks

/// The `file` store: each provider's token in a file of its own in one directory, sealed
/// (`StoreRecord`), so that a broker started again serves it without fetching.
///
/// - The directory is checked and opened once at start, as a token file's is (`SinkDirectory`:
///   it must exist, belong to the broker's user or root, and not be writable by others; the
///   broker also refuses ACLs that let others write it, or a default ACL, `Broker.aclProblem`).
/// - A record's file is named by the SHA-256 of its key (`StoreSlot.key`), in hexadecimal, with
///   `.record`: no provider name or value reaches a path.
/// - Writes are atomic and durable (`AtomicFileWriter`: a temporary file, `fsync`, `rename`,
///   mode 0600) and run on the store's own queue, in order, never on the caller's thread.
/// - Reads run on the same queue, after the writes handed to it before (the caller suspends
///   meanwhile), through `FileContents`, which never waits on a FIFO or reads past `maximumSize`.
/// - A forgotten key's record (a template child dropped, `forget`) is removed once its token has
///   expired (at once for a token without expiry, or a record that cannot be opened), unless the
///   key is loaded or saved again first: the directory does not grow with every child ever made,
///   nor the store's memory with a writer for each.
public final class FileTokenStore: TokenStore {
    /// What the store reports of its writes, for logs and metrics: the key, and the problem when one failed.
    public typealias SaveReport = @Sendable (_ key: String, _ problem: String?) -> Void

    /// The directory, as opened at start.
    public let directory: SinkDirectory
    private let record: StoreRecord
    private let onSave: SaveReport
    private let onRemove: SaveReport
    private let queue = DispatchQueue(label: "token-broker.store.file")
    /// One writer per key, made at its first write (and its leftovers removed then).
    private let writers = Lock<[String: AtomicFileWriter]>([:])
    /// Keys forgotten and not saved since, whose records are removed once their tokens expire,
    /// each with the number of its one pending check (a check of an earlier number stops).
    private let forgotten = Lock<(keys: [String: UInt64], lastCheck: UInt64)>(([:], 0))
    private let wallClock: @Sendable () -> WallTime
    private let after: @Sendable (Duration, @escaping @Sendable () -> Void) -> Void

    /// The longest wait before a forgotten record is looked at again (a token that lives for
    /// years is looked at daily, not scheduled years ahead).
    static let longestWait = Duration.seconds(86_400)

    /// A store in `directory`, sealing with `cipher`.
    /// - Parameters:
    ///   - onRemove: each forgotten record removed (`forget`), with the problem when that failed.
    ///   - wallClock: now, for when a forgotten record's token expires.
    ///   - after: runs its work after the delay (on any thread); tests run it when they choose.
    public init(
        directory: SinkDirectory, cipher: AESGCM, onSave: @escaping SaveReport = { _, _ in },
        onRemove: @escaping SaveReport = { _, _ in }, wallClock: @escaping @Sendable () -> WallTime = { WallTime() },
        after: (@Sendable (Duration, @escaping @Sendable () -> Void) -> Void)? = nil
    ) {
        self.directory = directory
        record = StoreRecord(cipher: cipher)
        self.onSave = onSave
        self.onRemove = onRemove
        self.wallClock = wallClock
        let queue = queue
        self.after =
            after ?? { delay, work in
                let (seconds, attoseconds) = delay.components
                queue.asyncAfter(
                    deadline: .now() + .seconds(Int(seconds)) + .nanoseconds(Int(attoseconds / 1_000_000_000)),
                    execute: work)
            }
    }

    /// The file of the record kept under `key`, in the store's directory.
    /// (Should SHA-256 ever fail, every key shares one file, `.record`, whose records then fail
    /// to authenticate under any other key: refused, never served to the wrong provider.)
    public func path(for key: String) -> String {
        let name = (try? Fingerprint.sha256Hex(key)) ?? ""
        return directory.path + (directory.path.hasSuffix("/") ? "" : "/") + name + ".record"
    }

    /// Reads on the store's queue, after every write handed to it before, and suspends the caller
    /// meanwhile: its thread never waits on the file system.
    public func load(_ key: String) async -> StoreLoad {
        await withCheckedContinuation { continuation in
            queue.async { [self] in
                // A child made again for these values may rely on the record: a forgotten key is taken back.
                _ = forgotten.withLock { $0.keys.removeValue(forKey: key) }
                continuation.resume(returning: read(key))
            }
        }
    }

    /// On the queue: the record kept under `key`, opened, or why there is none to use.
    private func read(_ key: String) -> StoreLoad {
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
            // Needed again (a child made anew for the same values): kept.
            _ = forgotten.withLock { $0.keys.removeValue(forKey: key) }
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

    public func forget(_ key: String) {
        queue.async { [self] in
            // Forgotten already: its check is pending.
            let check = forgotten.withLock { forgotten -> UInt64? in
                guard forgotten.keys[key] == nil else { return nil }
                forgotten.lastCheck += 1
                forgotten.keys[key] = forgotten.lastCheck
                return forgotten.lastCheck
            }
            if let check { removeIfExpired(key, check: check) }
        }
    }

    /// Waits until every write handed to the store has ended; for the broker's stop.
    public func flush() { queue.sync {} }

    /// On the queue: removes a forgotten key's record if its token has expired (no provider would
    /// serve it), has no expiry (it would stay for good) or the record cannot be opened under its
    /// key, else looks again when the token expires. A file that cannot be read is left alone.
    private func removeIfExpired(_ key: String, check: UInt64) {
        guard forgotten.withLock({ $0.keys[key] == check }) else { return }
        let path = path(for: key)
        switch FileContents.read(path, limit: StoreRecord.maximumSize) {
        case .failure(let error):
            letGo(key)
            if !error.isMissing { onRemove(key, "cannot read \(path): \(error)") }
            return
        case .success(let bytes):
            if case .success(let token) = record.open(bytes, key: key), let expiresAt = token.expiresAt,
                case let left = expiresAt.timeIntervalSince(wallClock()), left > 0
            {
                let wait = min(Duration.milliseconds(Int64(rounding: left * 1000, .up) ?? .max), Self.longestWait)
                after(wait) { [self] in queue.async { self.removeIfExpired(key, check: check) } }
                return
            }
        }
        let writer =
            letGo(key)
            ?? {
                let writer = AtomicFileWriter(directory: directory, path: path, mode: 0o600)
                _ = writer.removeLeftovers()  // a crash's temporary files of this record, too
                return writer
            }()
        onRemove(key, writer.remove()?.description)
    }

    /// Stops tracking a forgotten key; returns its writer, if it had one.
    @discardableResult
    private func letGo(_ key: String) -> AtomicFileWriter? {
        _ = forgotten.withLock { $0.keys.removeValue(forKey: key) }
        return writers.withLock { $0.removeValue(forKey: key) }
    }

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
