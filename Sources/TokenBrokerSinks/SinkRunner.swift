import Dispatch
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerCrypto

/// Writes each new token of one provider to one file (`SinkConfiguration`), for as long as
/// `run()` runs.
///
/// - At start, the temporary files an earlier run left behind are removed
///   (`AtomicFileWriter.removeLeftovers`), and reported (`SinkEvents.cleanedUp`).
/// - Each new version is written once, in the configured format: `token`, the bare token with
///   no newline; `json`, the `/token` body (`TokenResponseBody.render`) without `expires_in`,
///   which would go stale in a file that cannot count down (its reader reads `expires_at`; for
///   the same reason `set_cookie`, when the provider sets a cookie, has no `Max-Age`). `stale`
///   is as it was when written. In `json`, the same token renewed with a later expiry (same
///   version) is written again, so that `expires_at` stays true; it is noticed at the next
///   periodic look (see below).
/// - While refresh fails, the file keeps the last good token; once that expires, the file is
///   left as it is (its reader sees the expiry) and `status()` says it no longer holds a valid
///   token. An expired token is never written.
/// - A failed write is reported, and tried again at the next token, or after `retryDelay` with
///   the token then valid, whichever comes first, until one succeeds.
/// - A file that a writer of its directory removed or replaced since the last write, or that a
///   writer of the file changed in place (`AtomicFileWriter.replacementProblem()`), is written
///   again, with the token then valid, at the next periodic look (see below); `status()` reports
///   it meanwhile. Another writer's copy of what it wrote (a second broker with the same token)
///   is no such problem, and is left as it is.
/// - Writes block (`open`, `fsync`, `rename`), so they run on a serial queue of the sink's own,
///   never on Swift's cooperative pool; the task of `run()` only waits, suspended.
///
/// Keeping the provider awake: a provider pauses background refresh when nobody read it for
/// `tokenRefreshDelaySec` and no waiter is registered (`ProviderStateMachine.tick`). A sink is
/// always waiting (`onTokenReady`), and its wait ends at the latest after half that delay, and
/// is registered again at once, each registration counting as activity: so a provider read only
/// by a sink never pauses, and the file never falls behind.
public final class SinkRunner<C: Clock>: Sendable where C.Duration == Duration {
    /// The sink's settings.
    public let configuration: SinkConfiguration
    /// The provider whose tokens are written (for a template, the child the sink holds).
    public let provider: TokenProvider<C>
    /// How soon a failed write is tried again with the same token, when no new one comes first.
    public let retryDelay: Duration
    /// The longest one wait for a new token lasts before the sink looks again (and registers
    /// anew, which keeps the provider awake).
    public let lookInterval: Duration
    private let writer: AtomicFileWriter
    private let events: SinkEvents
    private let queue: DispatchQueue
    private let state: Lock<State>

    private struct State: Sendable {
        var status: SinkStatus
        /// The written token's expiry on the provider's clock; nil when it has none (or none was written).
        var writtenExpiry: C.Instant?
    }

    /// What the file holds, as far as the loop knows: the version and renewal last written.
    private struct Written {
        var version: UInt64
        var renewal: UInt64
    }

    /// - Parameters:
    ///   - provider: must refresh in the background (the configuration refuses sinks on others).
    ///   - directory: the file's directory, opened and checked at start (`SinkDirectory.open`);
    ///     every write goes through it.
    ///   - events: hooks for logs and metrics, called after each write.
    ///   - retryDelay: the wait before a failed write is tried again with the same token.
    public init(
        configuration: SinkConfiguration, provider: TokenProvider<C>, directory: SinkDirectory,
        events: SinkEvents = SinkEvents(), retryDelay: Duration = .seconds(5)
    ) {
        self.configuration = configuration
        self.provider = provider
        self.events = events
        self.retryDelay = retryDelay
        lookInterval = max(.milliseconds(500), .seconds(provider.configuration.tokenRefreshDelaySec) / 2)
        writer = AtomicFileWriter(directory: directory, path: configuration.path, mode: configuration.mode)
        queue = DispatchQueue(label: "token-broker.sink")
        state = Lock(
            State(
                status: SinkStatus(
                    provider: configuration.provider, path: configuration.path, format: configuration.format)
            ))
    }

    /// A runner whose file's directory is opened and checked (`SinkDirectory.open`) now, trusting
    /// its writers as the configuration says (`trustDirectoryWriters`).
    public convenience init(
        configuration: SinkConfiguration, provider: TokenProvider<C>, events: SinkEvents = SinkEvents(),
        retryDelay: Duration = .seconds(5)
    ) throws(SinkDirectoryProblem) {
        let directory = try SinkDirectory.open(
            BrokerConfiguration.directory(of: configuration.path), trustingWriters: configuration.trustDirectoryWriters
        ).get()
        self.init(
            configuration: configuration, provider: provider, directory: directory, events: events,
            retryDelay: retryDelay)
    }

    /// Removes the leftovers of earlier runs, then writes each new token until the calling task
    /// is cancelled or the provider shuts down. A write under way when that happens finishes first.
    public func run() async {
        await removeLeftovers()
        var written: Written?
        // The newest version tried: written, or failed and due to be tried again.
        var attempted: UInt64 = 0
        while !Task.isCancelled {
            let failing = attempted > (written?.version ?? 0)
            let outcome = await provider.onTokenReady(
                after: attempted, timeout: failing ? min(retryDelay, lookInterval) : lookInterval)
            let token: TokenProvider<C>.Token
            let stale: Bool
            var restoring = false
            switch outcome {
            case .token(let next, let isStale):
                (token, stale) = (next, isStale)
            case .timedOut, .exhausted:
                // No newer token: write the current one if the file lacks it (a failed write to
                // try again, a renewed expiry for `json`, a file removed, replaced or changed by
                // another writer); never an expired one.
                guard case .token(let current, let isStale, _) = provider.read() else { continue }
                restoring = written != nil && writer.replacementProblem() != nil
                guard restoring || needsWrite(current, over: written) else { continue }
                (token, stale) = (current, isStale)
            case .shuttingDown, .cancelled:
                return
            }
            let isRetry = failing && token.version == attempted
            attempted = max(attempted, token.version)
            if await write(token, stale: stale, isRetry: isRetry, isRestore: restoring) {
                written = Written(version: token.version, renewal: token.renewal)
            }
        }
    }

    /// Makes sure this runner never writes its file again, once it is stopped (its task
    /// cancelled) and another may write the file: a write under way is abandoned before its
    /// rename (`AtomicFileWriter.retire(waitingAtMost:)`). Waits at most `limit` for a rename
    /// under way, never for the rest of a write; false when one still is.
    public func retire(waitingAtMost limit: Duration) -> Bool { writer.retire(waitingAtMost: limit) }

    /// What the sink has done so far, whether its file holds a valid token now, and whether its
    /// directory is still the one at its path, and the file the one last written (a `stat` each,
    /// outside the lock).
    public func status() -> SinkStatus {
        let now = provider.clock.now
        var status = state.withLock { state in
            var status = state.status
            status.holdsValidToken = status.version != nil && state.writtenExpiry.map { now < $0 } ?? true
            return status
        }
        status.directoryProblem = writer.directory.replacementProblem()
        status.fileProblem = writer.replacementProblem()
        return status
    }

    // MARK: - Writing

    /// Whether the file lacks `token`: a newer version, or in `json` the same token renewed.
    private func needsWrite(_ token: TokenProvider<C>.Token, over written: Written?) -> Bool {
        guard let written else { return true }
        if token.version != written.version { return token.version > written.version }
        return configuration.format == .json && token.renewal != written.renewal
    }

    /// The file's contents for `token`.
    private func contents(_ token: TokenProvider<C>.Token, stale: Bool) -> [UInt8] {
        switch configuration.format {
        case .token:
            return Array(token.token.accessToken.utf8)
        case .json:
            // No expires_in: a number the file would keep while it goes stale.
            let body = TokenResponseBody.render(
                token, stale: stale, expiresIn: nil, provider: provider.name, cookie: provider.configuration.cookie)
            return Array(body.utf8)
        }
    }

    /// Removes leftover temporary files on the sink's queue, and reports it.
    private func removeLeftovers() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async { [self] in
                let (removed, error) = writer.removeLeftovers()
                events.cleanedUp(SinkEvents.Cleanup(sink: configuration, removed: removed, error: error))
                continuation.resume()
            }
        }
    }

    /// Writes `token` on the sink's queue, records and reports the outcome; true when the file now holds it.
    private func write(_ token: TokenProvider<C>.Token, stale: Bool, isRetry: Bool, isRestore: Bool) async -> Bool {
        let bytes = contents(token, stale: stale)
        let (version, expiry) = (token.version, token.expiresAt)
        let fingerprint = Fingerprint.of(token.token.accessToken)
        return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            queue.async { [self] in
                let result = writer.write(bytes)
                let error = result.failure
                state.withLock { state in
                    if let error, error.isAbandoned {
                        // Retired: the file is the next writer's now, and this one's state stays as it was.
                    } else if let error {
                        state.status.failures += 1
                        state.status.lastError = error
                    } else {
                        state.status.writes += 1
                        state.status.lastError = nil
                        state.status.version = version
                        state.status.fingerprint = fingerprint
                        state.writtenExpiry = expiry
                    }
                }
                events.wrote(
                    SinkEvents.Write(
                        sink: configuration, version: version, fingerprint: fingerprint, error: error, isRetry: isRetry,
                        isRestore: isRestore))
                continuation.resume(returning: error == nil)
            }
        }
    }
}

extension Result {
    /// The error, or nil on success.
    fileprivate var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
