import Glibc
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerServer
import TokenBrokerSinks
import TokenBrokerSources

/// Reloading the configuration (SIGHUP, `POST /reload` on the admin listener, `token-broker
/// reload`): the steps `Broker.serve` takes at each one, on the main thread, one at a time.
///
/// 1. The file is read again, the environment's overrides applied, and everything
///    `--check-config` checks is checked, and that no changed signer publishes a new key under a
///    kid that names a key still published for its tokens (`keyIDClash`). A problem: `invalid`,
///    and nothing changes. The providers are compared by name first (`compare`), so that keys are
///    generated and key files read only for the added and changed ones: an unchanged one's
///    source is kept as it is.
/// 2. A change only a restart can make (`restartNeeded`): `refused`, and nothing changes.
/// 3. A provider whose settings and credential files are the same keeps running as it is: its
///    source, token, version, timers and waiters. A changed one gets a replacement, numbered
///    after it; new ones are made.
/// 4. The new providers that fetch at start (replacements and added ones) are given
///    `reloadTimeoutSec` to get their first token, while the old ones keep serving, so that no
///    route answers 503 for want of a first token. One that does not: `abandoned`, the new
///    providers stop, and nothing changes. A stop signal meanwhile abandons the reload too
///    (`ReloadOutcome.stopping`), as it does each one asked for from then on (`ReloadRequests.close`).
/// 5. When any token file's settings or provider changed, the token files get new writers over
///    the new providers, which start once the reload takes; the old writers go on until then. The
///    reload waits for each file that holds a valid token to have one at hand for its new writer,
///    or is abandoned (`restartSinks`).
/// 6. Each listener's routes are made anew over the new providers and swapped in: requests
///    from then on see the new configuration; connections, and requests under way, stay.
/// 7. The replaced and removed providers shut down. A replaced provider's waiters (long-polls,
///    requests waiting for a token) are handed to its replacement, which numbers its tokens
///    after the old one's; a removed provider's, and a replaced template's, are answered 503
///    `shutting_down`, as at a stop. A replaced template's successor makes its children after
///    every version the old one's handed out.
extension Broker {
    /// What one configuration made: a reload replaces it whole, keeping the unchanged parts.
    /// Read and changed on the main thread only.
    final class Loaded {
        let configuration: BrokerConfiguration
        /// Each provider's source and local signer, by provider name.
        let sources: [String: (any TokenSource, JWTSigner?)]
        /// Each provider's credential files' digests, by provider name (`credentialDigests`).
        let digests: [String: [[UInt8]?]]
        let providers: Providers
        let identityHeader: [UInt8]?
        /// The digest of the store's key as the store opened it at start (`StoreKeyFile.digest`;
        /// nil without a key): the store keeps it until a restart, so a reload that finds another
        /// key is refused.
        let storeKey: [UInt8]?
        /// The digest of the Redis password the store logs in with, read at start
        /// (`storePasswordDigest`; nil without one): kept until a restart, as the key is.
        let storePassword: [UInt8]?
        /// Each provider's and template's running task, by name.
        private(set) var tasks: [String: Task<Void, Never>]

        /// Signers no longer configured, or whose key changed, with the instant their last token
        /// expires: the JWKS publishes their keys until then, so that tokens they signed still verify.
        let retiredSigners: [RetiredSigner]

        /// - Parameter digests: each provider's `credentialDigests`, in configuration order, taken
        ///   before its source read the files (a file changed in between makes the next reload
        ///   replace the provider, never keep a stale key).
        init(
            configuration: BrokerConfiguration, sources: [(any TokenSource, JWTSigner?)], digests: [[[UInt8]?]],
            providers: Providers, identityHeader: [UInt8]?, storeKey: [UInt8]?, storePassword: [UInt8]?,
            tasks: [String: Task<Void, Never>] = [:],
            retiredSigners: [RetiredSigner] = []
        ) {
            self.configuration = configuration
            // Names are unique: the configuration refuses a name given twice.
            let names = configuration.providers.map(\.name)
            self.sources = Dictionary(zip(names, sources)) { first, _ in first }
            self.digests = Dictionary(zip(names, digests)) { first, _ in first }
            self.providers = providers
            self.identityHeader = identityHeader
            self.storeKey = storeKey
            self.storePassword = storePassword
            self.tasks = tasks
            self.retiredSigners = retiredSigners
        }

        /// Runs each provider and template that has no task yet in a task of its own.
        func startTasks() {
            for made in providers.all where tasks[made.name] == nil {
                tasks[made.name] = Task.detached { await made.run() }
            }
        }

        /// The JSON Web Key Set of the local signers, in configuration order, then the retired
        /// ones' whose tokens may still be valid; each key under each kid once. No two keys share
        /// a kid: `keyIDClash` refuses such a configuration at start and at each reload.
        var jwks: String {
            JWTSigner.jwks(configuration.providers.compactMap { sources[$0.name]?.1 } + retiredSigners.map(\.signer))
        }
    }

    /// Shuts down each provider and template: their waiters are answered 503 `shutting_down`
    /// now, their timers and fetches stop, and their tasks end.
    static func shutDown(_ providers: Providers) {
        for made in providers.all { made.shutDown() }
    }

    /// Serves until SIGTERM or SIGINT, and returns its name; reloads at each SIGHUP, and
    /// answers the `POST /reload` requests waiting for it.
    static func serve(_ running: Running, path: String?) -> String {
        while true {
            switch Signals.next() {
            case .stop(let name):
                return name
            case .reload:
                let waiting = running.reloads.take()
                let (outcome, stop) = reload(running, path: path)
                running.metrics.recordReload(result: outcome.result)
                if case .reloaded(let summary) = outcome {
                    Log.info(
                        "configuration reloaded",
                        [
                            "added": summary.added.joined(separator: ","),
                            "changed": summary.changed.joined(separator: ","),
                            "removed": summary.removed.joined(separator: ","),
                            "unchanged": summary.unchanged.joined(separator: ","),
                        ])
                } else {
                    Log.error(
                        "configuration not reloaded",
                        ["result": outcome.result, "problem": outcome.problem ?? ""])
                }
                for ended in waiting { ended(outcome) }
                if let stop { return stop }
            }
        }
    }

    /// One reload, by the steps above; with the stop signal that arrived during it, if one did.
    private static func reload(_ running: Running, path: String?) -> (ReloadOutcome, stop: String?) {
        let old = running.loaded
        // 1. Read and check.
        let configuration: BrokerConfiguration
        let digests: [[[UInt8]?]]
        let summary: ReloadSummary
        let sources: [(any TokenSource, JWTSigner?)]
        let directories: [SinkDirectory]
        let identityHeader: [UInt8]?
        do throws(ConfigurationError) {
            configuration = try Options.load(path: path, environment: Environment.variables())
            // The digests before the sources read the files (see `Loaded.init`).
            digests = configuration.providers.map(credentialDigests)
            summary = compare(
                old: old.configuration.providers.map { ($0, old.digests[$0.name] ?? []) },
                new: Array(zip(configuration.providers, digests)))
            // An unchanged provider keeps its source: no key made or read again for it (a signer
            // without keyFile would make one, RSA in a good part of a second, to be thrown away).
            sources = try makeSources(
                configuration, reusing: old.sources.filter { summary.unchanged.contains($0.key) })
            // A new key under a kid that still names the key of tokens signed before (a rotation
            // that kept its kid): refused, as two providers' keys under one kid are at start.
            let retiring = retire(old, summary: summary)
            if let clash = keyIDClash(configuration, sources, retired: retiring) { throw clash }
            directories = try openSinkDirectories(configuration).get()
            identityHeader = try readIdentityHeader(configuration)
            // The store's key file, directory and password file, as `--check-config` reads them.
            _ = try openStore(configuration, metrics: nil, connect: false).get()
            // The keys file must name only providers of the new configuration, as at start.
            if old.configuration.clientKeysFile == configuration.clientKeysFile {
                _ = try loadCallerKeys(configuration)
            }
        } catch {
            return (.invalid(problem: error.description), nil)
        }
        // 2. What only a restart changes.
        if let problem = restartNeeded(
            from: old.configuration, to: configuration, storeKeyChanged: old.storeKey != storeKeyDigest(configuration),
            storePasswordChanged: old.storePassword != storePasswordDigest(configuration))
        {
            return (.refused(problem: problem), nil)
        }
        if let problem = httpClientFailure(configuration) { return (.invalid(problem: problem), nil) }
        // 3. Make what is new.
        var made = Providers(providers: [], templates: [])
        var tasks: [String: Task<Void, Never>] = [:]
        for ((settings, source), credentials) in zip(zip(configuration.providers, sources), digests)
        where !summary.unchanged.contains(settings.name) {
            var predecessor: Provider?
            var versionsAfter: UInt64 = 0
            switch old.providers.named(settings.name) {
            case .provider(let previous)?:
                predecessor = previous
                versionsAfter = previous.highestVersion
            case .template(let previous)?:
                versionsAfter = previous.highestVersion
            case nil:
                break
            }
            let provider = makeProvider(
                settings, source, credentials: credentials, store: running.store, metrics: running.metrics,
                versionsAfter: versionsAfter)
            // Before it runs: the old provider's token, when this one fetches or reads it again,
            // keeps its version (`TokenProvider.numberAfter`).
            if case .provider(let replacement) = provider, let predecessor { replacement.numberAfter(predecessor) }
            made.add(provider)
            tasks[settings.name] = Task.detached { await provider.run() }
        }
        /// Ends the reload with nothing changed: the providers it made stop. Their tasks end
        /// once a fetch under way has; when the broker is stopping, `stop` waits for them after
        /// the listeners, so that the long-polls' `shutting_down` answers do not wait for them.
        func discard(_ outcome: ReloadOutcome, stop: String? = nil) -> (ReloadOutcome, stop: String?) {
            shutDown(made)
            if stop == nil {
                waitForEnd(of: Array(tasks.values), atMost: .seconds(5))
            } else {
                running.discardedTasks += tasks.values
            }
            return (outcome, stop)
        }
        func abandon(_ problem: String) -> (ReloadOutcome, stop: String?) { discard(.abandoned(problem: problem)) }
        // 4. The new providers' first tokens.
        let awaited = made.providers.filter(\.configuration.backgroundRefreshEnabled)
        let deadline = ContinuousClock.now.advanced(by: .seconds(configuration.reloadTimeoutSec))
        switch waitUntil(deadline, for: { awaited.first { !$0.status().hasValidToken } }) {
        case .done: break
        case .stopping(let stop): return discard(.stopping, stop: stop)
        case .pastDeadline(let pending):
            let what = summary.added.contains(pending.name) ? "it" : "its replacement"
            var problem =
                "provider \(JSONText.quoted(pending.name)): \(what) got no token within"
                + " \(configuration.reloadTimeoutSec) s (reloadTimeoutSec)"
            if let error = pending.status().lastError { problem += "; last error: \(error.summary)" }
            return abandon(problem)
        }
        // 5. The new set, in configuration order, and the token files over it.
        var providers = Providers(providers: [], templates: [])
        for settings in configuration.providers {
            guard let provider = made.named(settings.name) ?? old.providers.named(settings.name) else { continue }
            providers.add(provider)
        }
        let restartsSinks =
            configuration.sinks != old.configuration.sinks
            || configuration.sinks.contains { !summary.unchanged.contains($0.provider) }
        if restartsSinks {
            switch restartSinks(running, configuration, directories, providers, until: deadline) {
            case .started: break
            case .invalid(let problem):
                return discard(.invalid(problem: problem))
            case .notWritten(let problem):
                return abandon(problem)
            case .stopping(let stop):
                return discard(.stopping, stop: stop)
            }
        }
        // 6. The routes over the new set. An unchanged provider kept its source (step 1): a local
        // signer made at start keeps its key, which the JWKS goes on publishing.
        let retiredSigners = retire(old, summary: summary)
        let loaded = Loaded(
            configuration: configuration, sources: sources, digests: digests, providers: providers,
            identityHeader: identityHeader, storeKey: old.storeKey, storePassword: old.storePassword,
            tasks: tasks.merging(old.tasks.filter { summary.unchanged.contains($0.key) }) { new, _ in new },
            retiredSigners: retiredSigners)
        // The replacements go on after the versions the old providers handed out while they
        // waited; one that serves the old provider's token (its stored record) keeps its version.
        for replacement in made.providers {
            if case .provider(let previous)? = old.providers.named(replacement.name) {
                replacement.numberAfter(previous)
            }
        }
        // A replaced template's children are answered 503 and go; the clients come back to the
        // new one's children, which go on after every version the old ones handed out.
        for replacement in made.templates {
            if case .template(let previous)? = old.providers.named(replacement.name) {
                replacement.numberAfter(previous.highestVersion)
            }
        }
        let handlers = makeHandlers(
            configuration, providers: providers, sinks: running.currentSinks, jwks: loaded.jwks,
            callers: running.callers, keyPlaces: running.keyPlaces, identityHeader: identityHeader,
            store: running.store, metrics: running.metrics, reloads: running.reloads, stopping: running.stopping)
        // The keys may name the new providers before their routes are served.
        if let problem = running.callers?.use(knownProviders: Set(configuration.providers.map(\.name))) {
            Log.error("caller keys not reloaded; the previous list stays", ["problem": problem.description])
        }
        running.listeners.token.replaceHandler(handlers.token)
        running.listeners.admin.replaceHandler(handlers.admin)
        for listener in running.listeners.compat {
            if let routes = handlers.compat.first(where: { $0.name == listener.name }) {
                listener.server.replaceHandler(routes.handler)
            }
        }
        running.loaded = loaded
        // 7. What is no longer served. A replaced provider's waiters go to its replacement.
        for settings in old.configuration.providers where !summary.unchanged.contains(settings.name) {
            switch (old.providers.named(settings.name), made.named(settings.name)) {
            case (.provider(let previous)?, .provider(let replacement)?):
                previous.shutDown(handingWaitersTo: replacement)
            case (let previous?, _): previous.shutDown()
            case (nil, _): break
            }
        }
        let retired = old.configuration.providers.filter { !summary.unchanged.contains($0.name) }
        waitForEnd(of: retired.compactMap { old.tasks[$0.name] }, atMost: .seconds(5))
        warnAboutExposedSecretFiles(configuration)
        warnAboutOpenAccess(configuration)
        for warning in compatWarnings(configuration) { Log.warning("compat", ["problem": warning]) }
        for warning in templateWarnings(configuration) { Log.warning("template", ["problem": warning]) }
        return (.reloaded(summary), nil)
    }

    /// The most retired signers' keys the JWKS keeps publishing: reloads that change a signer
    /// without `keyFile` make a new key each time, and neither memory nor the JWKS may grow
    /// with their number. Past it, the keys whose tokens expire first go first.
    static let retiredSignersLimit = 16

    /// The signers whose keys the JWKS keeps after this reload: the old configuration's
    /// retired ones still within their tokens' lifetime, and the signers of the providers it
    /// changes or removes (an HS256 secret is never published, nor kept); each key under each
    /// kid once, until the latest expiry of the tokens it signed, the `retiredSignersLimit`
    /// that last longest. A key the current signers still publish is kept too: a provider that
    /// keeps its key across a reload that shortens its `lifetimeSec` signed tokens under the
    /// longer one, which a later rotation must not cut short (the JWKS publishes the key once).
    static func retire(_ old: Loaded, summary: ReloadSummary) -> [RetiredSigner] {
        let now = ContinuousClock.now
        var retired = old.retiredSigners.filter { $0.until > now }
        for settings in old.configuration.providers where !summary.unchanged.contains(settings.name) {
            guard let signer = old.sources[settings.name]?.1, signer.publicJWK != nil else { continue }
            retired.append(
                RetiredSigner(
                    signer: signer, provider: settings.name,
                    until: now.advanced(by: .seconds(signer.configuration.lifetimeSec))))
        }
        // A key by what the JWKS publishes of it: the public key and its kid; the latest expiry.
        var latest: [String: RetiredSigner] = [:]
        for entry in retired {
            guard let key = entry.signer.publicJWK else { continue }
            if let known = latest[key], known.until >= entry.until { continue }
            latest[key] = entry
        }
        let kept = latest.sorted {
            $0.value.until != $1.value.until ? $0.value.until > $1.value.until : $0.key < $1.key
        }
        .prefix(retiredSignersLimit).map(\.value)
        return kept.reversed()
    }

    /// How handing the token files to new writers ended.
    private enum SinksRestart {
        case started
        /// The new configuration's files cannot all be held (a template at `maxChildren`).
        case invalid(String)
        /// A file that holds a valid token has none to be written by its new writer at the deadline.
        case notWritten(String)
        case stopping(String)
    }

    /// Step 5, before the routes are swapped. The new writers are made over the new providers
    /// (holding the template children their files name), but start only once the reload takes:
    /// until then the old writers go on writing every file, through the directories opened
    /// when they started. The reload waits until each file that holds a valid token has one at
    /// hand for its new writer; then the old writers end (a write under way finishes, and their
    /// held children are let go), the new ones start, and the reload waits for them to write
    /// those files, so that `/readyz` never reports a file the reload emptied.
    ///
    /// A reload that does not take lets go of the new writers' children, and that is all: no
    /// file has held a token of a configuration that did not take, and no old writer was
    /// stopped, so none needs starting again (which would reopen, and check again, a directory
    /// that may since have been replaced or opened to others).
    private static func restartSinks(
        _ running: Running, _ configuration: BrokerConfiguration, _ directories: [SinkDirectory],
        _ providers: Providers, until deadline: ContinuousClock.Instant
    ) -> SinksRestart {
        let sinks: Sinks
        do {
            sinks = try makeSinks(configuration, directories: directories, providers: providers) {
                [metrics = running.metrics] in metrics.recordSinkWrite(provider: $0, succeeded: $1)
            }
        } catch {
            return .invalid(error.description)
        }
        let readyBefore = Set(
            running.sinks.sinks.runners.filter { $0.status().holdsValidToken }.map(\.configuration.path))
        let keptReady = sinks.runners.filter { readyBefore.contains($0.configuration.path) }
        let outcome: SinksRestart
        switch waitUntil(deadline, for: { keptReady.first { !$0.provider.status().hasValidToken } }) {
        case .done:
            stopSinks(running.sinks)
            let started = startSinks(sinks)
            // The reload has taken: the new writers get a moment to write (their tokens are at
            // hand), 1 s at most, so that a write that fails (a full disk: `/readyz` and the log
            // say so) does not hold the main loop until the deadline; a stop signal is left for
            // the main loop. Only then does `/readyz` report them: until their first write it
            // reports the old writers, stopped, with the valid tokens they wrote, not a file
            // "not ready" because its new writer has yet to write it.
            let until = ContinuousClock.now.advanced(by: .seconds(1))
            while ContinuousClock.now < until, keptReady.contains(where: { !$0.status().holdsValidToken }) {
                usleep(5_000)
            }
            running.sinks = started
            return .started
        case .stopping(let stop):
            outcome = .stopping(stop)
        case .pastDeadline(let pending):
            var problem =
                "token file \(JSONText.quoted(pending.configuration.path)): its provider"
                + " \(JSONText.quoted(pending.configuration.provider)) got no token within"
                + " \(configuration.reloadTimeoutSec) s (reloadTimeoutSec)"
            if let error = pending.provider.status().lastError { problem += "; last error: \(error.summary)" }
            outcome = .notWritten(problem)
        }
        for (template, values) in sinks.held { template.release(values) }
        return outcome
    }

    /// How `waitUntil` ended.
    private enum WaitEnd<Pending> {
        /// Nothing is pending any more.
        case done
        /// The deadline passed with this still pending.
        case pastDeadline(Pending)
        /// SIGTERM or SIGINT came, by name (a SIGHUP stays pending for the next reload).
        case stopping(String)
    }

    /// Waits, on the main thread, until `pending` finds nothing, the deadline passes, or a stop
    /// signal comes; it looks again every 20 ms.
    private static func waitUntil<Pending>(
        _ deadline: ContinuousClock.Instant, for pending: () -> Pending?
    ) -> WaitEnd<Pending> {
        while let found = pending() {
            guard ContinuousClock.now < deadline else { return .pastDeadline(found) }
            if let stop = Signals.stopSignal(waitingAtMost: .milliseconds(20)) { return .stopping(stop) }
        }
        return .done
    }

    /// The providers by fate, by name: a provider is unchanged when its settings and its credential
    /// files' digests are the same; a template that becomes a provider, or back, is changed.
    static func compare(
        old: [(settings: ProviderConfiguration, digests: [[UInt8]?])],
        new: [(settings: ProviderConfiguration, digests: [[UInt8]?])]
    ) -> ReloadSummary {
        var summary = ReloadSummary()
        for (settings, digests) in new {
            guard let previous = old.first(where: { $0.settings.name == settings.name }) else {
                summary.added.append(settings.name)
                continue
            }
            if previous.settings == settings, previous.digests == digests {
                summary.unchanged.append(settings.name)
            } else {
                summary.changed.append(settings.name)
            }
        }
        summary.removed = old.map(\.settings.name).filter { name in !new.contains { $0.settings.name == name } }
        return summary
    }

    /// Why `new` cannot be loaded without a restart: it changes a listener, the connections'
    /// limits, the caller keys file, the store, its key (`storeKeyChanged`: the key file now
    /// holds another) or its Redis password (`storePasswordChanged`: the password file now holds
    /// another; the store logs in with the one it read at start, on every connection it makes
    /// until a restart), the log format, or adds the first proxy (the token listener reads
    /// proxied bodies as streams only when it starts with a proxy).
    static func restartNeeded(
        from old: BrokerConfiguration, to new: BrokerConfiguration, storeKeyChanged: Bool = false,
        storePasswordChanged: Bool = false
    ) -> String? {
        var changed: [String] = []
        if old.listen != new.listen { changed.append("listen") }
        if old.adminListen != new.adminListen { changed.append("adminListen") }
        if old.compat.gce?.listen != new.compat.gce?.listen { changed.append("compat.gce.listen") }
        if old.compat.azure?.listen != new.compat.azure?.listen { changed.append("compat.azure.listen") }
        if old.connectionLimit != new.connectionLimit { changed.append("connectionLimit") }
        if old.connectionTimeoutSec != new.connectionTimeoutSec { changed.append("connectionTimeoutSec") }
        if old.connectionMemoryKiB != new.connectionMemoryKiB { changed.append("connectionMemoryKiB") }
        if old.unixSocketMode != new.unixSocketMode { changed.append("unixSocketMode") }
        if old.clientKeysFile != new.clientKeysFile { changed.append("clientKeysFile") }
        if old.store != new.store {
            changed.append("store")
        } else {
            if storeKeyChanged { changed.append("store.keyFile (the key it holds)") }
            if storePasswordChanged { changed.append("store.passwordFile (the password it holds)") }
        }
        if old.logFormat != new.logFormat { changed.append("logFormat") }
        if old.proxies.isEmpty, !new.proxies.isEmpty { changed.append("proxies (the first one)") }
        guard !changed.isEmpty else { return nil }
        return "changing \(changed.joined(separator: ", ")) needs a restart"
    }
}

/// The `POST /reload` requests waiting for the main thread to reload: each asks by raising
/// SIGHUP, which the main thread takes as any other; requests that arrive while a reload runs
/// get the next one's outcome, since the file may have changed since that one read it.
///
/// Once the broker begins to stop (`close`), the main thread reloads no more: the requests
/// waiting then, and each one after, are answered at once with `ReloadOutcome.stopping`, logged
/// and counted as an abandoned reload, rather than left to the admin listener's final 503
/// `shutting_down` when it closes (seconds later while a proxied answer drains), uncounted.
final class ReloadRequests: Sendable {
    private struct State {
        var waiting: [@Sendable (ReloadOutcome) -> Void] = []
        var closed = false
    }

    private let state = Lock<State>(State())
    private let metrics: BrokerMetrics
    /// The abandoned reloads answered while stopping are logged once a second at most: a client
    /// can ask for them as often as it likes until the admin listener closes.
    private let stoppingLog = LogThrottle(interval: .seconds(1))

    init(metrics: BrokerMetrics) { self.metrics = metrics }

    /// Asks for a reload; `ended` is called once, with its outcome: on the main thread, or on
    /// the caller's at once when the broker is stopping.
    func request(_ ended: @escaping @Sendable (ReloadOutcome) -> Void) {
        let closed = state.withLock { state in
            if !state.closed { state.waiting.append(ended) }
            return state.closed
        }
        guard !closed else { return abandonWhileStopping([ended]) }
        // Fails only for an invalid signal or for another process's pid.
        if kill(getpid(), SIGHUP) != 0 {
            let reason = String(cString: strerror(errno))
            for ended in take() { ended(.abandoned(problem: "cannot signal the broker: \(reason)")) }
        }
    }

    /// The requests waiting now, handed over once.
    func take() -> [@Sendable (ReloadOutcome) -> Void] {
        state.withLock { state in
            defer { state.waiting = [] }
            return state.waiting
        }
    }

    /// Called once, on the main thread, as the broker begins to stop: the requests waiting are
    /// answered now, together as one abandoned reload (they waited for the same next one), and
    /// each later request at once, as a reload of its own.
    func close() {
        let waiting = state.withLock { state in
            state.closed = true
            defer { state.waiting = [] }
            return state.waiting
        }
        if !waiting.isEmpty { abandonWhileStopping(waiting) }
    }

    private func abandonWhileStopping(_ requests: [@Sendable (ReloadOutcome) -> Void]) {
        let outcome = ReloadOutcome.stopping
        metrics.recordReload(result: outcome.result)
        switch stoppingLog.admit(at: .now) {
        case nil: break
        case 0?:
            Log.error("configuration not reloaded", ["result": outcome.result, "problem": outcome.problem ?? ""])
        case let notLogged?:
            Log.error(
                "configuration not reloaded",
                ["result": outcome.result, "problem": outcome.problem ?? "", "not_logged": String(notLogged)])
        }
        for ended in requests { ended(outcome) }
    }
}
