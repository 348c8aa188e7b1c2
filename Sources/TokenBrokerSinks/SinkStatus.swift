import TokenBrokerCore

/// A token file's published state, for `/readyz` and the metrics.
public struct SinkStatus: Sendable, Equatable {
    /// The provider named in the configuration (a template's name for a child, never a requested value).
    public var provider: String
    /// The file.
    public var path: String
    public var format: SinkConfiguration.Format
    /// The version of the token the file holds, from the last successful write; nil before the first.
    public var version: UInt64?
    /// The fingerprint (`Fingerprint.of`) of the token the file holds; nil before the first write.
    public var fingerprint: String?
    /// Whether the token the file holds is still valid now: false before the first write and
    /// once that token has expired (refresh failing, or the file not writable), when the file
    /// is left as it is and its reader sees the old expiry.
    public var holdsValidToken: Bool
    /// Successful writes since start.
    public var writes: Int
    /// Failed writes since start.
    public var failures: Int
    /// Why the last write failed, until a write succeeds; nil when the last write succeeded.
    public var lastError: FileWriteError?
    /// Why readers of the path no longer see the file's writes (its directory was replaced
    /// since start: `SinkDirectory.replacementProblem()`), looked at when the status is read.
    public var directoryProblem: String?
    /// Why readers of the path do not read what was last written (a writer of the directory
    /// removed or replaced the file since, or put a directory in its place; a writer of the file
    /// changed it in place: `AtomicFileWriter.replacementProblem()`), looked at when the status
    /// is read.
    public var fileProblem: String?

    /// Why readers of the path do not read what the broker wrote, or nil: the directory's problem
    /// first, since the file's is looked for in the directory opened at start.
    public var problem: String? { directoryProblem ?? fileProblem }

    public init(
        provider: String, path: String, format: SinkConfiguration.Format, version: UInt64? = nil,
        fingerprint: String? = nil, holdsValidToken: Bool = false, writes: Int = 0, failures: Int = 0,
        lastError: FileWriteError? = nil, directoryProblem: String? = nil, fileProblem: String? = nil
    ) {
        self.provider = provider
        self.path = path
        self.format = format
        self.version = version
        self.fingerprint = fingerprint
        self.holdsValidToken = holdsValidToken
        self.writes = writes
        self.failures = failures
        self.lastError = lastError
        self.directoryProblem = directoryProblem
        self.fileProblem = fileProblem
    }
}

/// Hooks through which a sink reports its writes, for logs and metrics (such as
/// `BrokerMetrics.recordSinkWrite(provider:succeeded:)`). Called off Swift's cooperative pool,
/// on the sink's own queue, right after the write.
public struct SinkEvents: Sendable {
    /// What one write did.
    public struct Write: Sendable {
        /// The sink's configuration (its `provider` is the configured name).
        public var sink: SinkConfiguration
        /// The version of the token written, or not written.
        public var version: UInt64
        /// The token's fingerprint (`Fingerprint.of`): logs name the token by this, never by value.
        public var fingerprint: String
        /// Nil when the file now holds the token; else why it does not.
        public var error: FileWriteError?
        /// Whether this write tried again a token whose write had failed.
        public var isRetry: Bool
        /// Whether this write put the token back into a file that a writer of its directory had
        /// removed or replaced, or a writer of the file changed, since the last write
        /// (`AtomicFileWriter.replacementProblem()`).
        public var isRestore = false
    }

    /// What the removal of leftover temporary files at a sink's start did.
    public struct Cleanup: Sendable {
        /// The sink's configuration.
        public var sink: SinkConfiguration
        /// How many leftover temporary files were removed.
        public var removed: Int
        /// The first failure, if any (the other leftovers were still tried).
        public var error: FileWriteError?
    }

    /// A write ended, well or not.
    public var wrote: @Sendable (Write) -> Void
    /// The leftovers of earlier runs were removed, at the sink's start, before its first write.
    public var cleanedUp: @Sendable (Cleanup) -> Void

    /// Hooks that do nothing unless given.
    public init(
        wrote: @escaping @Sendable (Write) -> Void = { _ in },
        cleanedUp: @escaping @Sendable (Cleanup) -> Void = { _ in }
    ) {
        self.wrote = wrote
        self.cleanedUp = cleanedUp
    }
}
