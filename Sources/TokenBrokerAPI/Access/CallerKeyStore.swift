import Dispatch
import Glibc
import Synchronization
import TokenBrokerCore
import TokenBrokerCrypto

/// The callers' keys from `clientKeysFile`, re-read when the file changes.
///
/// A key is checked by hashing it (SHA-256) and comparing the hash with every listed one in
/// constant time (`CRYPTO_memcmp`), without stopping at the first match, so the time taken says
/// nothing about which bytes or which entry matched. A background task looks at the file's
/// identity (inode, size, modification time) once a second; a changed file that does not parse
/// leaves the previous list in force.
///
/// Each list read is numbered (`State.number`). A request that waits keeps the caller `admit` let
/// in (`AdmittedCaller`: the matched entry's hash and the list's number), and is checked again
/// when answered (`recheck`): while the list is the one that let it in, nothing is looked up;
/// after a re-read, its hash is looked up in the new list, as a key is, without hashing again.
///
/// Locks: `state` and `watcher` are each taken alone, never one inside the other.
public final class CallerKeyStore: CallerRechecking, Sendable {
    public let path: String
    /// The providers a key may name: those configured now (a reload changes them).
    private let knownProviders: Lock<Set<String>>
    private let state: Lock<State>
    private let watcher = Lock<Watch?>(nil)

    /// The running watch: its task, and what the task signals as it ends.
    private struct Watch: @unchecked Sendable {
        // DispatchSemaphore is thread-safe but not marked Sendable.
        var task: Task<Void, Never>
        var ended: DispatchSemaphore
    }

    private struct State {
        var list: CallerKeyList
        /// Which list this is: one more at every list read in place of the one before.
        var number: UInt64 = 0
        var identity: FileIdentity?

        mutating func use(_ list: CallerKeyList, identity: FileIdentity?) {
            self.list = list
            number &+= 1
            self.identity = identity
        }
    }

    /// What happened at a re-read: the number of callers now listed, or why the file was refused.
    public typealias ReloadEvent = @Sendable (Result<Int, ConfigurationError>) -> Void

    /// Reads the file once; the broker refuses to start when this throws.
    public init(path: String, knownProviders: Set<String>) throws(ConfigurationError) {
        self.path = path
        self.knownProviders = Lock(knownProviders)
        let identity = FileIdentity(path)
        state = Lock(State(list: try Self.read(path, knownProviders: knownProviders), identity: identity))
    }

    /// Starts looking for changes every `interval`, reporting each re-read to `onReload`, until `stop()`.
    public func watch(every interval: Duration = .seconds(1), onReload: @escaping ReloadEvent) {
        let ended = DispatchSemaphore(value: 0)
        // The task holds the store until it ends, and it ends when stop() cancels it.
        let task = Task.detached { [self] in
            defer { ended.signal() }
            while true {
                do {
                    try await Task.sleep(for: interval)
                } catch {
                    return
                }
                if let event = reloadIfChanged() { onReload(event) }
            }
        }
        let replaced = watcher.withLock { watcher in
            defer { watcher = Watch(task: task, ended: ended) }
            return watcher
        }
        replaced?.task.cancel()
    }

    /// Stops the watch and waits until its task has ended, at most `limit`; true if it ended.
    ///
    /// - Important: blocks the calling thread: call it at shutdown, from outside Swift's
    ///   cooperative pool (the broker calls it on the main thread).
    @discardableResult
    public func stop(waitingAtMost limit: Duration = .seconds(2)) -> Bool {
        guard
            let watch = watcher.withLock({ watcher in
                defer { watcher = nil }
                return watcher
            })
        else { return true }
        watch.task.cancel()
        return watch.ended.wait(timeout: .now() + .milliseconds(Int(clamping: limit.wholeMilliseconds))) == .success
    }

    /// At a configuration reload: the providers configured from now on. The file is read again
    /// against them, now, and is the list in force when it is valid; otherwise the list stays,
    /// and the problem is returned (the reload checked the file, so only a change since can fail).
    public func use(knownProviders names: Set<String>) -> ConfigurationError? {
        knownProviders.withLock { $0 = names }
        let identity = FileIdentity(path)
        do {
            let list = try Self.read(path, knownProviders: names)
            state.withLock { $0.use(list, identity: identity) }
            return nil
        } catch {
            state.withLock { $0.identity = identity }
            return error
        }
    }

    /// Re-reads the file if it changed since the last look; nil when it did not.
    public func reloadIfChanged() -> Result<Int, ConfigurationError>? {
        let identity = FileIdentity(path)
        guard identity != state.withLock({ $0.identity }) else { return nil }
        do {
            let list = try Self.read(path, knownProviders: knownProviders.withLock { $0 })
            state.withLock { $0.use(list, identity: identity) }
            return .success(list.entries.count)
        } catch {
            // Remember the broken version, so that it is reported once, not every second.
            state.withLock { $0.identity = identity }
            return .failure(error)
        }
    }

    public var count: Int { state.withLock { $0.list.entries.count } }

    public func authorize(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerDecision {
        admit(authorization, provider: provider).decision
    }

    public func admit(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerAdmission {
        guard let key = Self.bearerKey(authorization) else { return .refused(.missingKey) }
        // A key that cannot be hashed matches no one.
        guard let digest = try? Crypto.sha256(key) else { return .refused(.unknownKey) }
        let (entries, number) = state.withLock { ($0.list.entries, $0.number) }
        guard let match = Self.entry(digest, in: entries) else { return .refused(.unknownKey) }
        guard match.mayRead(provider) else { return .refused(.forbidden(caller: match.name)) }
        return .allowed(AdmittedCaller(keyDigest: match.digest, provider: provider, list: number))
    }

    public func recheck(_ caller: AdmittedCaller) -> CallerDecision {
        // While the list that let the caller in is in force, it still may: one lock, no look-up.
        guard let entries = state.withLock({ $0.number == caller.list ? nil : $0.list.entries }) else {
            return .allowed
        }
        guard let match = Self.entry(caller.keyDigest, in: entries) else { return .unknownKey }
        return match.mayRead(caller.provider) ? .allowed : .forbidden(caller: match.name)
    }

    /// The entry whose hash is `digest`; every entry is compared, whatever the outcome of the
    /// others, in constant time.
    private static func entry(_ digest: [UInt8], in entries: [CallerKeyList.Entry]) -> CallerKeyList.Entry? {
        var match: CallerKeyList.Entry?
        for entry in entries where Crypto.constantTimeEqual(digest, entry.digest) { match = entry }
        return match
    }

    /// The key of `Authorization: Bearer <key>` (RFC 6750 §2.1; the scheme in any case), as the
    /// bytes sent: after the scheme and the spaces that follow it, up to the end, none of them a
    /// space; nil when there is none.
    static func bearerKey(_ header: UnsafeBufferPointer<UInt8>?) -> UnsafeBufferPointer<UInt8>? {
        guard let header, header.count > scheme.count else { return nil }
        for (index, byte) in scheme.enumerated() where header[index].asciiLowercased != byte { return nil }
        var start = scheme.count
        while start < header.count, header[start] == 0x20 { start += 1 }
        let key = UnsafeBufferPointer(rebasing: header[start...])
        guard !key.isEmpty, !key.contains(0x20) else { return nil }
        return key
    }

    /// `Bearer ` in lowercase.
    private static let scheme = Array("bearer ".utf8)

    /// The largest caller-keys file read: 4 MiB, some twenty thousand callers.
    public static let maxFileBytes = 4 << 20

    private static func read(_ path: String, knownProviders: Set<String>) throws(ConfigurationError) -> CallerKeyList {
        // Never waits (a FIFO is refused, not read) and never reads more than the limit.
        let bytes: [UInt8]
        switch FileContents.read(path, limit: maxFileBytes) {
        case .success(let contents): bytes = contents
        case .failure(let error):
            throw ConfigurationError(key: "clientKeysFile", "cannot read \(path): \(error.reason)")
        }
        do {
            return try CallerKeyList(json: bytes, knownProviders: knownProviders)
        } catch {
            throw ConfigurationError(
                key: error.key.isEmpty ? "clientKeysFile" : "clientKeysFile \(path): \(error.key)", error.message)
        }
    }
}

/// What tells one version of a file from the next without reading it.
struct FileIdentity: Equatable {
    let device: UInt64, inode: UInt64, size: Int64, modified: timespec, changed: timespec

    init?(_ path: String) {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        device = UInt64(status.st_dev)
        inode = UInt64(status.st_ino)
        size = Int64(status.st_size)
        modified = status.st_mtim
        changed = status.st_ctim
    }

    static func == (a: FileIdentity, b: FileIdentity) -> Bool {
        a.device == b.device && a.inode == b.inode && a.size == b.size
            && a.modified.tv_sec == b.modified.tv_sec && a.modified.tv_nsec == b.modified.tv_nsec
            && a.changed.tv_sec == b.changed.tv_sec && a.changed.tv_nsec == b.changed.tv_nsec
    }
}
