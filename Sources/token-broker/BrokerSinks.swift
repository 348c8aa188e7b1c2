internal import CSystem
import Dispatch
import Glibc
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerSinks

/// Token files (`sinks`): the steps `Broker.run` and `Broker.stop` take for them.
///
/// In `run`: `openSinkDirectories` after the configuration is read (a problem exits 2,
/// "invalid configuration"); `makeSinks` once the providers are made, with each sink's provider
/// (for a template, the child held for the sink's values) and the directory opened and checked
/// at start, kept open for every write; and `startSinks` once they run. In
/// `stop`: `stopSinks` before the providers shut down, so that a write under way ends with the
/// token it began with.
extension Broker {
    /// A sink and the provider it writes from.
    struct SinkTarget {
        let sink: SinkConfiguration
        let provider: Provider
        /// For a template's child: the template and the values it holds the child for, released at stop.
        var held: (template: Template, values: TokenRequestValues)? = nil
    }

    /// The sinks' runners, made before the listeners open so that `/readyz` can report them.
    struct Sinks: Sendable {
        let runners: [SinkRunner<ContinuousClock>]
        let held: [(template: Template, values: TokenRequestValues)]

        /// Each token file's state, as `/readyz` reports it, in configuration order.
        func reports() -> [AdminAPI.TokenFileReport] {
            runners.map { runner in
                let status = runner.status()
                return AdminAPI.TokenFileReport(
                    provider: status.provider, path: status.path, version: status.version,
                    ready: status.holdsValidToken && status.problem == nil,
                    lastError: status.lastError?.description, problem: status.problem)
            }
        }
    }

    /// The token files `/readyz` reports: the writers running now. The admin routes read them
    /// here at each request, never the writers they were made with: a reload that did not take
    /// can start writers anew without making new routes, and a route that kept the writers
    /// stopped by the reload would report their last state for as long as it served.
    final class CurrentSinks: Sendable {
        private let sinks: Lock<Sinks>

        init(_ sinks: Sinks) { self.sinks = Lock(sinks) }

        /// From now on, the writers that `/readyz` reports.
        func use(_ sinks: Sinks) { self.sinks.withLock { $0 = sinks } }

        /// Each token file's state now (`Sinks.reports`).
        func reports() -> [AdminAPI.TokenFileReport] { sinks.withLock { $0 }.reports() }
    }

    /// The sinks' runners, each in a task of its own.
    struct RunningSinks {
        let sinks: Sinks
        let tasks: [Task<Void, Never>]
    }

    /// Each sink's directory, opened and checked (`SinkDirectory.open`), in configuration order;
    /// else the first problem, as `sinks[0].path: …`: a directory that cannot hold a token file,
    /// one with a default ACL, one where no file can be made (`creationProblem`: `/proc`, a
    /// read-only mount), a name too long for it, a path that is a directory, a file the broker
    /// reads or makes (`UsedFiles`), or two sinks naming the same file through `..` or
    /// symbolic links (the same directory, by device and inode, and the same name).
    ///
    /// A sink with `trustDirectoryWriters` has its directory opened trusting its writers (others
    /// may write it and the directories above it, by their mode or an ACL entry); once every
    /// directory is open, each such sink is logged as a warning, naming its directory and what
    /// others may write there, and so is whatever is at its path that is not a file
    /// (`SinkDirectory.plantedEntry(for:)`): a directory there, which any writer of the directory
    /// can make, does not refuse it. Start, `--check-config` and each reload call this, so each
    /// says it. Without it, a problem the trust would lift names it.
    static func openSinkDirectories(_ configuration: BrokerConfiguration) -> Result<[SinkDirectory], ConfigurationError>
    {
        var directories: [SinkDirectory] = []
        var files: [SinkDirectory.FileIdentity: Int] = [:]
        // The directories a file could be made in: probed once each, however many sinks share one.
        var probed: Set<SinkDirectory.FileIdentity> = []
        let used = UsedFiles(configuration)
        for (index, sink) in configuration.sinks.enumerated() {
            let key = "sinks[\(index)].path"
            let directory: SinkDirectory
            switch SinkDirectory.open(
                BrokerConfiguration.directory(of: sink.path), trustingWriters: sink.trustDirectoryWriters)
            {
            case .success(let opened): directory = opened
            case .failure(let problem):
                return .failure(
                    ConfigurationError(key: key, problem.description + (problem.trustWouldLift ? trustHint : "")))
            }
            if let problem = defaultACLProblem(directory, holding: "token file")
                ?? (directory.trustsWriters
                    ? nil : aclWriterProblem(directory, holding: "token file").map { $0 + trustHint })
                ?? directory.fileProblem(for: sink.path)
                ?? used.problem(for: sink.path, in: directory)
                ?? (probed.insert(directory.identity(of: ".")).inserted
                    ? directory.creationProblem(holding: "token file") : nil)
            {
                return .failure(ConfigurationError(key: key, problem))
            }
            let file = directory.identity(of: AtomicFileWriter.fileName(of: sink.path))
            if let earlier = files[file] {
                return .failure(
                    ConfigurationError(
                        key: key,
                        "\(JSONText.quoted(sink.path)) is the same file as sinks[\(earlier)].path "
                            + "\(JSONText.quoted(configuration.sinks[earlier].path)) (through .. or a symbolic link); "
                            + "allowed: one sink per file"))
            }
            files[file] = index
            directories.append(directory)
        }
        for (index, (sink, directory)) in zip(configuration.sinks, directories).enumerated()
        where directory.trustsWriters {
            Log.warning(
                "token file in a directory whose writers are trusted (trustDirectoryWriters): whoever can write it, "
                    + "or a directory above it, can replace or remove the token file between writes",
                [
                    "sink": "sinks[\(index)]", "path": sink.path, "directory": directory.path,
                    "writable_by_others": directory.otherWriters.isEmpty
                        ? "nothing now" : directory.otherWriters.joined(separator: "; "),
                ])
            if let planted = directory.plantedEntry(for: sink.path) {
                Log.warning(
                    "token file path holds no file; in a directory whose writers are trusted, any of them may have "
                        + "put it there",
                    ["sink": "sinks[\(index)]", "path": sink.path, "problem": planted])
            }
        }
        return .success(directories)
    }

    /// The end of a problem that `trustDirectoryWriters` would lift: others may write the
    /// directory, or one above it.
    private static let trustHint =
        "; or, when every user who can write there is trusted (a Kubernetes emptyDir), trustDirectoryWriters true"

    /// The files the broker reads or makes besides its token files (`BrokerConfiguration.filesUsed`:
    /// its configuration file, keys, secrets, TLS files, the store's), found as the file system
    /// finds them, so that a token file that is one of them, through `..`, a symbolic link or a
    /// hard link, is refused: each write would replace it (a private key, the configuration) and
    /// the next start would fail, or read a token as a key. A token file in the file store's
    /// directory is refused too: the files there are the store's.
    struct UsedFiles {
        /// Each file, as messages show it, by the name it has in its directory: the name as
        /// configured, and the name its symbolic links lead to, when they lead to one.
        private var names: [SinkDirectory.FileIdentity: String] = [:]
        /// Each existing file, as messages show it, by its device and inode, whatever name it goes by.
        private var inodes: [Inode: String] = [:]
        /// The file store's directory, by device and inode.
        private var storeDirectory: (inode: Inode, path: String)?

        private struct Inode: Hashable {
            let device: UInt64
            let inode: UInt64

            init(device: UInt64, inode: UInt64) { (self.device, self.inode) = (device, inode) }

            /// The file `path` leads to (following links); nil when there is none.
            init?(_ path: String) {
                var status = stat()
                guard stat(path, &status) == 0 else { return nil }
                (device, inode) = (UInt64(status.st_dev), UInt64(status.st_ino))
            }
        }

        init(_ configuration: BrokerConfiguration) {
            for path in configuration.filesUsed where !path.isEmpty {
                let shown =
                    path == configuration.configurationFile
                    ? "the configuration file \(path)"
                    : "\(path), a file the configuration names (a key, a secret, a TLS file, a socket, the store's)"
                for name in [path] + (Self.resolved(path).map { [$0] } ?? []) {
                    if let directory = Inode(BrokerConfiguration.directory(of: name)) {
                        let named = SinkDirectory.FileIdentity(
                            device: directory.device, inode: directory.inode, name: AtomicFileWriter.fileName(of: name))
                        names[named] = names[named] ?? shown
                    }
                }
                if let file = Inode(path) { inodes[file] = inodes[file] ?? shown }
            }
            if case .file(let path, _) = configuration.store, let directory = Inode(path) {
                storeDirectory = (directory, path)
            }
        }

        /// `path` with its symbolic links resolved (`realpath`), when it leads to a file that exists.
        private static func resolved(_ path: String) -> String? {
            guard let resolved = realpath(path, nil) else { return nil }
            defer { free(resolved) }
            return String(cString: resolved)
        }

        /// Why the token file `path`, in `directory` (opened and checked), would write over a
        /// file the broker uses, or nil.
        func problem(for path: String, in directory: SinkDirectory) -> String? {
            let name = AtomicFileWriter.fileName(of: path)
            let directoryInode = Inode(device: directory.device, inode: directory.inode)
            if let store = storeDirectory, store.inode == directoryInode {
                return "\(JSONText.quoted(path)) is in the store's directory \(store.path), whose files are the "
                    + "store's; allowed: a token file in a directory of its own"
            }
            var existing = stat()
            let found =
                names[directory.identity(of: name)]
                ?? (fstatat(directory.descriptor, name, &existing, AT_SYMLINK_NOFOLLOW) == 0
                    ? inodes[Inode(device: UInt64(existing.st_dev), inode: UInt64(existing.st_ino))] : nil)
            guard let found else { return nil }
            return "\(JSONText.quoted(path)) is \(found): each token written would replace it; allowed: a file of "
                + "its own"
        }
    }

    /// What the ACLs of a directory that holds token files or the store's records allow that its
    /// mode does not show (`defaultACLProblem`, `aclWriterProblem`), or nil; `what` names its files
    /// in the problem. The one check of both, made once the directory is open (the store's; a
    /// token file's makes both itself, since a directory opened trusting its writers lets them
    /// write it by an ACL entry too, and `SinkDirectory.otherWriters` names them).
    static func aclProblem(_ directory: SinkDirectory, holding what: String) -> String? {
        defaultACLProblem(directory, holding: what) ?? aclWriterProblem(directory, holding: what)
    }

    /// A default ACL on the directory would pass its entries on to each new file, whatever its
    /// mode: refused. Found with `fgetxattr` on the open directory; a file system without ACLs
    /// has none.
    private static func defaultACLProblem(_ directory: SinkDirectory, holding what: String) -> String? {
        guard fgetxattr(directory.descriptor, "system.posix_acl_default", nil, 0) < 0 else {
            return "the directory \(directory.path) has a default ACL, which each new \(what) would inherit "
                + "beyond its mode; allowed: a directory without one (remove it with setfacl -k)"
        }
        let code = errno
        guard code == ENODATA || code == ENOTSUP || code == EOPNOTSUPP else {
            return
                "the directory \(directory.path) cannot be examined for a default ACL: \(String(cString: strerror(code)))"
        }
        return nil
    }

    /// An access ACL that lets a named user other than the broker's, or any named group, write
    /// the directory makes it writable by others, which its mode bits do not show
    /// (`SinkDirectory.aclWriter`).
    private static func aclWriterProblem(_ directory: SinkDirectory, holding what: String) -> String? {
        switch SinkDirectory.aclWriter(of: directory.descriptor) {
        case .failure(let failure):
            return "the directory \(directory.path) \(failure)"
        case .success(let writer?) where writer.isGroup:
            return "the directory \(directory.path) lets \(writer) write it (an ACL entry): its members could "
                + "replace or remove the \(what); allowed: a directory only its owner and group can write"
        case .success(let writer?):
            return "the directory \(directory.path) lets \(writer) write it (an ACL entry): they could replace "
                + "or remove the \(what); allowed: a directory only its owner and group can write"
        case .success(nil):
            return nil
        }
    }

    /// One runner per sink, in configuration order, each on its provider: a configured provider
    /// found by name, or, for a template, the child held for the sink's values (kept alive, never
    /// dropped for idleness, until `stopSinks`). Fails when a template cannot hold one more child,
    /// and then lets go of the children it held.
    /// - Parameter directories: `openSinkDirectories`' result, one per sink: what start checked
    ///   is what every write goes through.
    static func makeSinks(
        _ configuration: BrokerConfiguration, directories: [SinkDirectory], providers: Providers,
        events recordWrite: @escaping @Sendable (_ provider: String, _ succeeded: Bool) -> Void
    ) throws(ConfigurationError) -> Sinks {
        var targets: [SinkTarget] = []
        do {
            try holdTargets(configuration, providers: providers, into: &targets)
        } catch {
            for case (let template, let values)? in targets.map(\.held) { template.release(values) }
            throw error
        }
        let events = SinkEvents(
            wrote: { write in
                if write.error?.isAbandoned != true { recordWrite(write.sink.provider, write.error == nil) }
                logSinkWrite(write)
            },
            cleanedUp: logSinkCleanup)
        return Sinks(
            runners: zip(targets, directories).map { target, directory in
                SinkRunner(configuration: target.sink, provider: target.provider, directory: directory, events: events)
            },
            held: targets.compactMap(\.held))
    }

    /// Each sink's provider, in order, appended to `targets` as it is found or held.
    private static func holdTargets(
        _ configuration: BrokerConfiguration, providers: Providers, into targets: inout [SinkTarget]
    ) throws(ConfigurationError) {
        for (index, sink) in configuration.sinks.enumerated() {
            if let provider = providers.providers.first(where: { $0.name == sink.provider }) {
                targets.append(SinkTarget(sink: sink, provider: provider))
                continue
            }
            guard let template = providers.templates.first(where: { $0.name == sink.provider }) else {
                throw ConfigurationError(key: "sinks[\(index)].provider", "no provider is named \"\(sink.provider)\"")
            }
            // The configuration checked the values against the template's allow-lists.
            let values: TokenRequestValues
            switch sink.requestValues(for: template.configuration) {
            case .success(let checked): values = checked
            case .failure(let problem):
                throw ConfigurationError(
                    key: "sinks[\(index)].\(problem.parameter.rawValue)", "is not a value the template allows")
            }
            switch template.hold(values) {
            case .success(let child):
                targets.append(SinkTarget(sink: sink, provider: child, held: (template, values)))
            case .failure:
                throw ConfigurationError(
                    key: "sinks[\(index)]",
                    "template \"\(template.name)\" cannot hold another child (maxChildren \(template.configuration.maxChildren))"
                )
            }
        }
    }

    /// Starts each runner in a task of its own.
    static func startSinks(_ sinks: Sinks) -> RunningSinks {
        let tasks = sinks.runners.map { runner in
            Task.detached {
                await runner.run()
                // Not stopped by `stopSinks`: its provider shut down.
                if !Task.isCancelled {
                    Log.warning(
                        "token file sink stopped: its provider shut down; the file keeps its last token",
                        ["provider": runner.configuration.provider, "path": runner.configuration.path])
                }
            }
        }
        for runner in sinks.runners {
            let sink = runner.configuration
            Log.info(
                "token file sink started",
                [
                    "provider": sink.provider, "path": sink.path, "format": sink.format.rawValue,
                    "mode": "0" + String(sink.mode, radix: 8), "values": sinkValues(sink),
                ])
        }
        return RunningSinks(sinks: sinks, tasks: tasks)
    }

    /// Stops every runner and waits, at most `limit`, for a write under way to end; then retires
    /// each runner's writer (`SinkRunner.retire(waitingAtMost:)`), so that a write still held up
    /// (a slow `fsync`) is abandoned rather than landing later over what the writers after it
    /// wrote. A rename itself under way gets 1 s more, then is logged and left.
    ///
    /// - Important: blocks the calling thread: call it from the main thread, never from Swift's pool.
    static func stopSinks(_ running: RunningSinks, atMost limit: Duration = .seconds(2)) {
        for task in running.tasks { task.cancel() }
        let ended = DispatchSemaphore(value: 0)
        let tasks = running.tasks
        Task.detached {
            for task in tasks { await task.value }
            ended.signal()
        }
        if ended.wait(timeout: .now() + .milliseconds(Int(clamping: limit.wholeMilliseconds))) == .timedOut {
            Log.warning(
                "a token file write was still under way at stop", ["waited_ms": String(limit.wholeMilliseconds)])
        }
        // A rename under way gets 1 s more, all files together: a hung file system holds
        // neither a stop nor a reload.
        let retireBy = ContinuousClock.now.advanced(by: .seconds(1))
        let landing = running.sinks.runners.filter { runner in
            !runner.retire(waitingAtMost: max(.zero, retireBy - ContinuousClock.now))
        }
        if !landing.isEmpty {
            Log.error(
                "a token file rename was still under way 1 s after the write's 2 s: if it lands, the file holds the"
                    + " stopped writer's token until the next write",
                ["paths": landing.map(\.configuration.path).joined(separator: ",")])
        }
        for (template, values) in running.sinks.held { template.release(values) }
    }

    /// One log line per write: the file, the version and the token's fingerprint; a failure with its reason.
    private static func logSinkWrite(_ write: SinkEvents.Write) {
        let sink = write.sink
        if let error = write.error, error.isAbandoned {
            Log.warning(
                "token file write abandoned: its writer was stopped before the write ended; the file keeps what"
                    + " was written before it, or after it by the writer that took over",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint,
                ])
        } else if let error = write.error {
            Log.error(
                "token file not written; the file keeps its previous token, and the write is tried again",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint, "problem": error.description,
                ])
        } else if write.isRestore {
            Log.warning(
                "token file written again: since the last write, a writer of its directory had removed or replaced"
                    + " it, or a writer of the file had changed it",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint,
                ])
        } else {
            Log.info(
                write.isRetry ? "token file written after a failed write" : "token file written",
                [
                    "provider": sink.provider, "path": sink.path, "version": String(write.version),
                    "token": write.fingerprint,
                ])
        }
    }

    /// The removal of leftover temporary files at a sink's start: logged with the count when
    /// there were any, and a failure with its reason.
    private static func logSinkCleanup(_ cleanup: SinkEvents.Cleanup) {
        let sink = cleanup.sink
        if let error = cleanup.error {
            Log.warning(
                "leftover temporary files of a token file not all removed",
                [
                    "provider": sink.provider, "path": sink.path, "removed": String(cleanup.removed),
                    "problem": error.description,
                ])
        } else if cleanup.removed > 0 {
            Log.info(
                "leftover temporary files of a token file removed",
                ["provider": sink.provider, "path": sink.path, "removed": String(cleanup.removed)])
        }
    }

    /// The child's values a sink names, for its log line: `defaults` when none.
    private static func sinkValues(_ sink: SinkConfiguration) -> String {
        TokenRequestValues(
            audience: sink.audience, scopes: sink.scope.map { $0.split(separator: " ").map(String.init) },
            resource: sink.resource
        ).description
    }
}
