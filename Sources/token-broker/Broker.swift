import Dispatch
import Synchronization
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerProxy
import TokenBrokerServer
import TokenBrokerSinks
import TokenBrokerSources
import TokenBrokerStore
import TokenBrokerUpstream

/// Wires the configuration into sources, providers and the two listeners; runs until a stop
/// signal, reloading the configuration at each SIGHUP (`BrokerReload.swift`).
///
/// `run` reads as the list of its steps; each step is a function below, in the order it runs.
enum Broker {
    /// A provider on the real clock.
    typealias Provider = TokenProvider<ContinuousClock>
    /// A provider template on the real clock, keeping each child's rendered answers beside it.
    typealias Template = ProviderTemplate<Provider, ChildAttachment, ContinuousClock>

    /// The configured providers, made: the ordinary ones and the templates, each in configuration order.
    struct Providers {
        var providers: [Provider]
        var templates: [Template]

        /// A provider or a template, as made.
        enum Made {
            case provider(Provider)
            case template(Template)

            var name: String {
                switch self {
                case .provider(let provider): provider.name
                case .template(let template): template.name
                }
            }

            /// Serves until shut down (`TokenProvider.run`, `ProviderTemplate.run`).
            func run() async {
                switch self {
                case .provider(let provider): await provider.run()
                case .template(let template): await template.run()
                }
            }

            /// Answers its waiters 503 `shutting_down`, stops its timers and fetches, ends `run()`.
            func shutDown() {
                switch self {
                case .provider(let provider): provider.shutDown()
                case .template(let template): template.shutDown()
                }
            }
        }

        /// The providers, then the templates.
        var all: [Made] { providers.map(Made.provider) + templates.map(Made.template) }

        mutating func add(_ made: Made) {
            switch made {
            case .provider(let provider): providers.append(provider)
            case .template(let template): templates.append(template)
            }
        }

        /// The provider or template named `name`.
        func named(_ name: String) -> Made? {
            if let provider = providers.first(where: { $0.name == name }) { return .provider(provider) }
            return templates.first(where: { $0.name == name }).map { .template($0) }
        }
    }

    /// The HTTP servers: the token listener, the admin listener, and the cloud SDK protocols'
    /// own listeners, when they have one (`compat.gce.listen`, `compat.azure.listen`).
    struct Listeners {
        let token: HTTPServer
        let admin: HTTPServer
        let compat: [CompatListener]
    }

    /// Each listener's routes, made from one configuration; a reload makes new ones and swaps them in.
    struct Handlers {
        let token: TokenAPI<Provider>
        let admin: AdminAPI
        /// The cloud SDK protocols' own listeners' routes, with the listener's name and address.
        let compat: [OwnCompatRoutes]
    }

    /// Set once, when the broker begins to stop: what `/readyz` reads to say it is no longer ready.
    final class StopFlag: Sendable {
        private let flag = Atomic<Bool>(false)

        var isSet: Bool { flag.load(ordering: .acquiring) }

        func set() { flag.store(true, ordering: .releasing) }
    }

    /// What `start` set going, for `stop` to end: the part a reload replaces (`Loaded`), and
    /// what stays for the process's life. Read and changed on the main thread only.
    final class Running {
        var loaded: Loaded
        /// The token files' writers; each new set is what `/readyz` reports from then on.
        var sinks: RunningSinks {
            didSet { currentSinks.use(sinks.sinks) }
        }
        /// What the admin routes read the token files' state from (`CurrentSinks`).
        let currentSinks: CurrentSinks
        let listeners: Listeners
        let callers: CallerKeyStore?
        /// With `callers`: the token listener's waiting places each key holds, kept across reloads.
        let keyPlaces: KeyWaitingPlaces?
        let store: OpenedStore?
        let metrics: BrokerMetrics
        let reloads: ReloadRequests
        let stopping: StopFlag
        /// The tasks of providers a reload made and discarded as the broker began to stop: `stop`
        /// waits for them with the others.
        var discardedTasks: [Task<Void, Never>] = []

        init(
            loaded: Loaded, sinks: RunningSinks, currentSinks: CurrentSinks, listeners: Listeners,
            callers: CallerKeyStore?, keyPlaces: KeyWaitingPlaces?, store: OpenedStore?, metrics: BrokerMetrics,
            reloads: ReloadRequests, stopping: StopFlag
        ) {
            self.stopping = stopping
            self.loaded = loaded
            self.sinks = sinks
            self.currentSinks = currentSinks
            currentSinks.use(sinks.sinks)
            self.listeners = listeners
            self.callers = callers
            self.keyPlaces = keyPlaces
            self.store = store
            self.metrics = metrics
            self.reloads = reloads
        }
    }

    /// Starts the broker and serves until SIGTERM or SIGINT, reloading `path` at each SIGHUP;
    /// returns the exit status (0 stopped, 1 cannot start, 2 bad configuration).
    static func run(_ configuration: BrokerConfiguration, path: String?) -> Int32 {
        // Before any thread starts (see `AllocatorTuning`).
        AllocatorTuning.limitArenas(AllocatorTuning.arenas(proxying: !configuration.proxies.isEmpty))
        Log.use(configuration.logFormat)
        // Before the sources and the store read the files: what a reload compares (`BrokerReload.swift`).
        let digests = configuration.providers.map(credentialDigests)
        let storeKey = storeKeyDigest(configuration)
        let storePassword = storePasswordDigest(configuration)
        let sources: [(any TokenSource, JWTSigner?)]
        do {
            sources = try makeSources(configuration)
        } catch {
            Log.error("invalid configuration", ["problem": error.description])
            return 2
        }
        if let problem = httpClientFailure(configuration) {
            Log.error("cannot start", ["problem": problem])
            return 1
        }
        logSigners(configuration, sources)
        warnAboutExposedSecretFiles(configuration)
        let callers: CallerKeyStore?
        do {
            callers = try loadCallerKeys(configuration)
        } catch {
            Log.error("invalid configuration", ["problem": error.description])
            return 2
        }
        if let callers { Log.info("caller keys loaded", ["file": callers.path, "callers": String(callers.count)]) }
        let identityHeader: [UInt8]?
        do {
            identityHeader = try readIdentityHeader(configuration)
        } catch {
            Log.error("invalid configuration", ["problem": error.description])
            return 2
        }
        for warning in compatWarnings(configuration) { Log.warning("compat", ["problem": warning]) }
        for warning in templateWarnings(configuration) { Log.warning("template", ["problem": warning]) }
        let sinkDirectories: [SinkDirectory]
        switch openSinkDirectories(configuration) {
        case .success(let opened): sinkDirectories = opened
        case .failure(let problem):
            Log.error("invalid configuration", ["problem": problem.description])
            return 2
        }
        let metrics = BrokerMetrics(version: Options.version)
        let store: OpenedStore?
        switch openStore(configuration, metrics: metrics) {
        case .success(let opened): store = opened
        case .failure(let problem):
            Log.error("invalid configuration", ["problem": problem.description])
            return 2
        }
        logStoreWarnings(configuration)
        let providers = makeProviders(configuration, sources, credentials: digests, store: store, metrics: metrics)
        let sinks: Sinks
        do {
            sinks = try makeSinks(configuration, directories: sinkDirectories, providers: providers) {
                metrics.recordSinkWrite(provider: $0, succeeded: $1)
            }
        } catch {
            Log.error("invalid configuration", ["problem": error.description])
            return 2
        }
        let connectionLimit = fitConnectionLimit(configuration)
        // With caller keys, one key may hold half the token listener's waiting places.
        let keyPlaces = callers.map { _ in
            KeyWaitingPlaces(listenerPlaces: HTTPServer.waitingLimit(connectionLimit: connectionLimit))
        }
        let reloads = ReloadRequests(metrics: metrics)
        let stopping = StopFlag()
        let loaded = Loaded(
            configuration: configuration, sources: sources, digests: digests, providers: providers,
            identityHeader: identityHeader, storeKey: storeKey, storePassword: storePassword)
        let currentSinks = CurrentSinks(sinks)
        let listeners: Listeners
        do {
            let handlers = makeHandlers(
                configuration, providers: providers, sinks: currentSinks, jwks: loaded.jwks, callers: callers,
                keyPlaces: keyPlaces, identityHeader: identityHeader, store: store, metrics: metrics, reloads: reloads,
                stopping: stopping)
            listeners = try openListeners(
                configuration, connectionLimit: connectionLimit, handlers: handlers, metrics: metrics)
        } catch {
            Log.error("cannot start", ["problem": error.description])
            return 1
        }
        let running = start(
            loaded, sinks: sinks, currentSinks: currentSinks, listeners: listeners, callers: callers,
            keyPlaces: keyPlaces, store: store, metrics: metrics, reloads: reloads, stopping: stopping)
        announce(configuration, listeners: listeners)
        let signal = serve(running, path: path)
        Log.info("stopping", ["signal": signal])
        stop(running)
        Log.info("stopped")
        return 0
    }

    // MARK: - Steps, in order

    /// The source for each provider, in order, with its local signer if it has one; reads key
    /// files, and generates keys where none is given. A template's source is its children's base.
    /// Also checks the TLS files of the sources and the proxies (`TLSFiles`), that no two signers
    /// publish different keys under one `kid`, and that each signer's claims fit in a token
    /// (`BrokerSigners.swift`).
    ///
    /// - Parameter reused: sources already made, by provider name (a reload's unchanged
    ///   providers': the same settings, and the same bytes in their credential files). Such a
    ///   provider keeps its source: no key is generated or read for it, and a signer keeps the key
    ///   the JWKS publishes. Its files that are read again at each fetch (a `clientSecretFile`)
    ///   and its TLS files are checked as any other's: their digests do not tell whether they
    ///   still read.
    static func makeSources(
        _ configuration: BrokerConfiguration, reusing reused: [String: (any TokenSource, JWTSigner?)] = [:]
    ) throws(ConfigurationError) -> [(any TokenSource, JWTSigner?)] {
        var sources: [(any TokenSource, JWTSigner?)] = []
        for (index, provider) in configuration.providers.enumerated() {
            let kept = reused[provider.name]
            switch provider.source {
            case .jwt(let settings):
                if let kept {
                    sources.append(kept)
                    continue
                }
                let key = "providers[\(index)].source"
                let signer: JWTSigner
                let tooLong: ConfigurationError?
                do {
                    signer = try JWTSigner(configuration: settings)
                    tooLong = try tokenSizeProblem(signer, perRequest: provider.perRequest, key: key)
                } catch {
                    throw ConfigurationError(key: key, error.detail)
                }
                if let tooLong { throw tooLong }
                sources.append((signer, signer))
            case .file(let settings):
                sources.append(kept ?? (FileTokenSource(configuration: settings), nil))
            case .oauth2(let settings):
                do {
                    try TLSFiles.check(settings.upstream)
                    if let path = settings.clientSecretFile { try SecretFile.checkLine(path) }
                    if let kept {
                        sources.append(kept)
                    } else {
                        sources.append((try OAuth2TokenSource(configuration: settings), nil))
                    }
                } catch {
                    throw ConfigurationError(key: "providers[\(index)].source", error.detail)
                }
            case .http(let settings):
                do {
                    try TLSFiles.check(settings.upstream)
                } catch {
                    throw ConfigurationError(key: "providers[\(index)].source", error.detail)
                }
                sources.append(kept ?? (HTTPTokenSource(configuration: settings), nil))
            }
        }
        if let clash = keyIDClash(configuration, sources) { throw clash }
        // The proxies' TLS files too: like the sources', libcurl opens them on its own thread.
        for (index, proxy) in configuration.proxies.enumerated() {
            do {
                try TLSFiles.check(proxy.upstream)
            } catch {
                throw ConfigurationError(key: "proxies[\(index)]", error.detail)
            }
        }
        return sources
    }

    /// Why the HTTP client for issuers and proxy targets cannot run, when the configuration needs it.
    static func httpClientFailure(_ configuration: BrokerConfiguration) -> String? {
        let needed =
            !configuration.proxies.isEmpty
            || configuration.providers.contains { provider in
                switch provider.source {
                case .oauth2, .http: true
                case .jwt, .file: false
                }
            }
        guard needed else { return nil }
        // Proxied traffic is spread over one libcurl loop per processor.
        return configuration.proxies.isEmpty
            ? UpstreamHTTPClient.shared.startFailure : UpstreamHTTPClient.shared.startProxyLoops()
    }

    /// Logs each local signer: its provider, algorithm, key id and key file.
    private static func logSigners(_ configuration: BrokerConfiguration, _ sources: [(any TokenSource, JWTSigner?)]) {
        for (settings, (_, signer)) in zip(configuration.providers, sources) {
            guard let signer else { continue }
            Log.info(
                "local signer ready",
                [
                    "provider": settings.name, "algorithm": signer.configuration.algorithm.rawValue,
                    "kid": signer.keyID,
                    "key": signer.configuration.keyFile ?? "generated at start",
                ])
        }
    }

    /// Warns about each secret file that other users can read (at start, and after each reload
    /// that takes: it may name new files).
    static func warnAboutExposedSecretFiles(_ configuration: BrokerConfiguration) {
        let files =
            configuration.providers.flatMap(\.source.secretFiles)
            + [configuration.compat.azure?.identityHeaderFile].compactMap { $0 } + configuration.store.secretFiles
        for (path, mode) in SecretFilePermissions.exposed(files) {
            Log.warning("a secret file can be read by other users; consider chmod 600", ["path": path, "mode": mode])
        }
    }

    /// The callers' keys from `clientKeysFile`, read once; nil when the configuration names no file.
    static func loadCallerKeys(_ configuration: BrokerConfiguration) throws(ConfigurationError) -> CallerKeyStore? {
        guard let path = configuration.clientKeysFile else { return nil }
        return try CallerKeyStore(path: path, knownProviders: Set(configuration.providers.map(\.name)))
    }

    /// One provider per configured one, each reporting its fetches to the log and `metrics`; a
    /// template (`perRequest`) becomes a `ProviderTemplate` whose children are such providers,
    /// each fetching from `childSource` for its values, under the template's name.
    /// - Parameter credentials: each provider's `credentialDigests`, in configuration order.
    private static func makeProviders(
        _ configuration: BrokerConfiguration, _ sources: [(any TokenSource, JWTSigner?)], credentials: [[[UInt8]?]],
        store: OpenedStore?, metrics: BrokerMetrics
    ) -> Providers {
        var made = Providers(providers: [], templates: [])
        for ((settings, source), digests) in zip(zip(configuration.providers, sources), credentials) {
            made.add(makeProvider(settings, source, credentials: digests, store: store, metrics: metrics))
        }
        return made
    }

    /// One provider, or one template, as `makeProviders` makes it.
    /// - Parameters:
    ///   - credentials: its `credentialDigests`, taken before its source read the files: part of
    ///     the settings its records are made under (`storeSlot`).
    ///   - versionsAfter: for a provider or a template that replaces one at a reload: the
    ///     version it numbers its tokens (a template, its children's) after.
    static func makeProvider(
        _ settings: ProviderConfiguration, _ source: (any TokenSource, JWTSigner?), credentials: [[UInt8]?],
        store: OpenedStore?, metrics: BrokerMetrics, versionsAfter: UInt64 = 0
    ) -> Providers.Made {
        let (base, signer) = source
        guard settings.isTemplate else {
            return .provider(
                Provider(
                    configuration: settings, source: base, clock: ContinuousClock(),
                    events: .logged(recordingIn: metrics),
                    store: storeSlot(store, provider: settings, signer: signer, credentials: credentials),
                    versionsAfter: versionsAfter))
        }
        var events = TemplateEvents.logged(recordingIn: metrics)
        if let store, isStored(settings) {
            // A dropped child's record goes once its token expires (`TokenStore.forget`); told
            // when the child has ended, so that no save of its last fetch comes after.
            events.ended = { name, values in store.tokenStore.forget(StoreSlot.key(provider: name, values: values)) }
        }
        return .template(
            Template(
                configuration: settings, clock: ContinuousClock(),
                makeChild: { values, versionsAfter in
                    Provider(
                        configuration: settings, source: childSource(for: settings, values: values, base: base),
                        clock: ContinuousClock(), events: .logged(recordingIn: metrics, child: values),
                        store: storeSlot(
                            store, provider: settings, signer: signer, credentials: credentials, values: values),
                        versionsAfter: versionsAfter)
                },
                attach: { TokenResponseCache(for: $0) }, events: events, versionsAfter: versionsAfter))
    }

    /// The source of a template's child: the template's source, fetching with `values` put in
    /// (`audience`, `scope`, `resource` in the token request, the signer's claims, an HTTP
    /// source's placeholders); `TokenRequestValues.none` is the template's own defaults.
    static func childSource(for settings: ProviderConfiguration, values: TokenRequestValues, base: any TokenSource)
        -> any TokenSource
    {
        // Every source a template may have makes children (the configuration refuses a file
        // source); a child shares its template's keys and client.
        (base as? any TemplatedTokenSource)?.child(for: values) ?? base
    }

    /// Raises the open-file limit, and gives each token-route listener a connection limit that
    /// fits in it (`ProcessLimits.fittedConnectionLimit`), with a warning when that is less than
    /// `connectionLimit`.
    private static func fitConnectionLimit(_ configuration: BrokerConfiguration) -> Int {
        let openFiles = ProcessLimits.raiseOpenFileLimit()
        let proxies = !configuration.proxies.isEmpty
        let ownListeners = [configuration.compat.gce?.listen, configuration.compat.azure?.listen].compactMap { $0 }
        // libcurl keeps up to 256 idle connections per loop; without proxies, loop 0 alone talks
        // to a few issuers.
        let upstream = proxies ? UpstreamHTTPClient.loopCount * 256 : 32
        let limit = ProcessLimits.fittedConnectionLimit(
            configured: configuration.connectionLimit, openFiles: openFiles,
            perConnection: (proxies ? 2 : 1) + ownListeners.count, upstream: upstream)
        if limit < configuration.connectionLimit {
            Log.warning(
                "the open-file limit is too low for connectionLimit: each token-route listener takes fewer connections",
                [
                    "open_files": String(openFiles), "connectionLimit": String(configuration.connectionLimit),
                    "connections_taken": String(limit),
                ])
        }
        return limit
    }

    /// Each listener's routes over `providers`: the token routes (with the proxy's and the cloud
    /// SDK protocols', when configured), the admin routes, and each protocol's own listener's.
    static func makeHandlers(
        _ configuration: BrokerConfiguration, providers: Providers, sinks: CurrentSinks, jwks: String,
        callers: CallerKeyStore?, keyPlaces: KeyWaitingPlaces?, identityHeader: [UInt8]?, store: OpenedStore?,
        metrics: BrokerMetrics, reloads: ReloadRequests, stopping: StopFlag
    ) -> Handlers {
        let compat = compatHandlers(
            configuration, templates: providers.templates, identityHeader: identityHeader, metrics: metrics)
        let proxy =
            configuration.proxies.isEmpty
            ? nil
            : ProxyAPI(
                proxies: configuration.proxies, providers: providers.providers,
                maxWait: .seconds(configuration.maxWaitSec),
                callerKeysInAuthorization: callers != nil, metrics: metrics,
                connectionMemory: configuration.connectionMemoryKiB * 1024)
        let token = TokenAPI(
            providers: providers.providers, templates: providers.templates,
            defaultName: configuration.providers[0].name, jwks: jwks, maxWait: .seconds(configuration.maxWaitSec),
            requestGuard: configuration.requestGuard, callers: callers, keyPlaces: keyPlaces, proxy: proxy,
            compat: compat.onTokenListener, metrics: metrics)
        let admin = AdminAPI(
            providers: providers.providers, templates: providers.templates, tokenFiles: { sinks.reports() },
            store: { storeReport(store) }, metrics: metrics, reload: { reloads.request($0) },
            stopping: { stopping.isSet })
        return Handlers(token: token, admin: admin, compat: compat.own)
    }

    /// Binds the listeners with their routes, and lets the metrics read their connection counts.
    /// - Parameter connectionLimit: each token-route listener's, as `fitConnectionLimit` found it.
    private static func openListeners(
        _ configuration: BrokerConfiguration, connectionLimit: Int, handlers: Handlers, metrics: BrokerMetrics
    ) throws(HTTPServerError) -> Listeners {
        var tokenSettings = tokenRouteSettings(
            configuration, address: configuration.listen, listener: "token", connectionLimit: connectionLimit)
        if !configuration.proxies.isEmpty {
            tokenSettings.streamingPrefix = ProxyPath.prefix
            // The token listener runs on the proxy's libcurl loops (started by `httpClientFailure`):
            // a proxied request is read, sent upstream and answered on one thread.
            tokenSettings.eventLoops = UpstreamHTTPClient.shared.eventLoops
        }
        let tokenServer = try HTTPServer(configuration: tokenSettings, handler: handlers.token)
        var adminSettings = HTTPServer.Configuration(address: configuration.adminListen)
        adminSettings.connectionLimit = ProcessLimits.adminConnections
        adminSettings.connectionTimeoutSec = configuration.connectionTimeoutSec
        adminSettings.threads = 1
        adminSettings.maximumBodyBytes = BodyLimits.admin
        adminSettings.unixSocketMode = configuration.unixSocketMode
        adminSettings.libraryLog = libraryLog(listener: "admin")
        let adminServer = try HTTPServer(configuration: adminSettings, handler: handlers.admin)
        var compat: [CompatListener] = []
        for (name, address, handler) in handlers.compat {
            let server = try HTTPServer(
                configuration: tokenRouteSettings(
                    configuration, address: address, listener: name, connectionLimit: connectionLimit),
                handler: handler)
            metrics.observeOpenConnections(listener: name) { [weak server] in server?.openConnections ?? 0 }
            metrics.observeEvictedConnections(listener: name) { [weak server] in server?.evictedConnections ?? 0 }
            metrics.observeWaiting(listener: name) { [weak server] in
                (server?.waitingRequests ?? 0, server?.refusedWaits ?? 0)
            }
            compat.append(CompatListener(name: name, address: address, server: server))
        }
        // Weakly: a server's routes hold the metrics, so a strong capture would be a cycle.
        metrics.observeOpenConnections(listener: "token") { [weak tokenServer] in tokenServer?.openConnections ?? 0 }
        metrics.observeOpenConnections(listener: "admin") { [weak adminServer] in adminServer?.openConnections ?? 0 }
        metrics.observeEvictedConnections(listener: "token") { [weak tokenServer] in
            tokenServer?.evictedConnections ?? 0
        }
        metrics.observeEvictedConnections(listener: "admin") { [weak adminServer] in
            adminServer?.evictedConnections ?? 0
        }
        metrics.observeWaiting(listener: "token", callerKeys: configuration.clientKeysFile != nil) {
            [weak tokenServer] in
            (tokenServer?.waitingRequests ?? 0, tokenServer?.refusedWaits ?? 0)
        }
        metrics.observeWaiting(listener: "admin") { [weak adminServer] in
            (adminServer?.waitingRequests ?? 0, adminServer?.refusedWaits ?? 0)
        }
        metrics.observeDroppedResponseHeaders { HTTPResponse.droppedHeaders }
        return Listeners(token: tokenServer, admin: adminServer, compat: compat)
    }

    /// Runs each provider and each template in a task of its own, starts the token files' sinks,
    /// and starts watching the caller keys file.
    private static func start(
        _ loaded: Loaded, sinks: Sinks, currentSinks: CurrentSinks, listeners: Listeners, callers: CallerKeyStore?,
        keyPlaces: KeyWaitingPlaces?, store: OpenedStore?, metrics: BrokerMetrics, reloads: ReloadRequests,
        stopping: StopFlag
    ) -> Running {
        loaded.startTasks()
        if let callers {
            let path = callers.path
            callers.watch { result in
                switch result {
                case .success(let count): Log.info("caller keys reloaded", ["file": path, "callers": String(count)])
                case .failure(let error):
                    Log.error("caller keys not reloaded; the previous list stays", ["problem": error.description])
                }
            }
        }
        return Running(
            loaded: loaded, sinks: startSinks(sinks), currentSinks: currentSinks, listeners: listeners,
            callers: callers, keyPlaces: keyPlaces, store: store, metrics: metrics, reloads: reloads,
            stopping: stopping)
    }

    /// Logs the addresses bound and the proxies ready, and warns about a configuration left open.
    private static func announce(_ configuration: BrokerConfiguration, listeners: Listeners) {
        Log.info("listening", ["listener": "token", "address": address(configuration.listen, listeners.token.port)])
        Log.info(
            "listening", ["listener": "admin", "address": address(configuration.adminListen, listeners.admin.port)])
        for listener in listeners.compat {
            Log.info(
                "listening", ["listener": listener.name, "address": address(listener.address, listener.server.port)])
        }
        for proxy in configuration.proxies {
            Log.info(
                "proxy ready",
                [
                    "proxy": proxy.name, "target": proxy.target.description,
                    "provider": proxy.provider ?? configuration.providers[0].name,
                ])
        }
        warnAboutOpenAccess(configuration)
    }

    /// Warns about settings that let more clients read tokens than a default broker lets: the
    /// request guard off, and a token listener other machines can reach without caller keys.
    /// Logged at start and after each reload that takes, since a reload may change either.
    static func warnAboutOpenAccess(_ configuration: BrokerConfiguration) {
        if !configuration.requestGuard {
            Log.warning("the request guard is off: token routes accept requests without Token-Broker-Request")
        }
        if !configuration.listen.isLoopback, configuration.clientKeysFile == nil {
            Log.warning(
                "the token listener is reachable from other machines and callers need no key (see clientKeysFile)",
                ["address": configuration.listen.description])
        }
    }

    /// Stops what `start` set going, in the order that matters; the one way the broker stops.
    /// From its first step, `/readyz` answers 503 (`stopping: true`), and `POST /reload` 503
    /// `reload_abandoned` at once: the requests waiting for a reload are answered now
    /// (`ReloadRequests.close`), since the main thread makes none from here on.
    ///
    /// 0. The token files' sinks stop, each once a write under way has ended, so that a file is
    ///    never left with a temporary beside it by the stop; held template children are released.
    /// 1. Each provider, and each template's children, shut down: their waiters (long-polls,
    ///    proxied requests waiting for a token) are answered 503 `shutting_down` now, on this
    ///    thread, before any listener drains; their timers and fetches stop, and their tasks'
    ///    `run()` return (a template's once its children's have).
    /// 2. The listeners drain: they refuse new connections and give answers in flight, those
    ///    waiters' among them, up to 5 s (token) and 1 s (admin) to go out.
    /// 3. The provider tasks end, each once its fetch has: a fetch still running at exit would
    ///    call OpenSSL after exit has torn it down (ThreadSanitizer saw EVP_Digest crash so).
    /// 4. The caller-key watcher stops: the token routes read its keys until their listener has
    ///    stopped.
    /// 5. The token store's writes under way end, so that no record is left half-made.
    private static func stop(_ running: Running) {
        running.stopping.set()
        running.reloads.close()
        stopSinks(running.sinks)
        shutDown(running.loaded.providers)
        running.listeners.token.shutDown(grace: .seconds(5))
        for listener in running.listeners.compat { listener.server.shutDown(grace: .seconds(1)) }
        running.listeners.admin.shutDown(grace: .seconds(1))
        waitForEnd(of: Array(running.loaded.tasks.values) + running.discardedTasks, atMost: .seconds(5))
        running.callers?.stop()
        closeStore(running.store)
    }

    // MARK: - Helpers

    /// A listener of token routes (the token listener, a cloud SDK protocol's own) as configured:
    /// its connection limit, timeout, memory per connection, body cap and Unix socket mode, and its
    /// libmicrohttpd messages logged under its name.
    static func tokenRouteSettings(
        _ configuration: BrokerConfiguration, address: ListenAddress, listener: String, connectionLimit: Int
    ) -> HTTPServer.Configuration {
        var settings = HTTPServer.Configuration(address: address)
        settings.connectionLimit = connectionLimit
        settings.connectionTimeoutSec = configuration.connectionTimeoutSec
        settings.connectionMemoryLimit = configuration.connectionMemoryKiB * 1024
        settings.maximumBodyBytes = BodyLimits.tokenRoutes
        settings.unixSocketMode = configuration.unixSocketMode
        settings.libraryLog = libraryLog(listener: listener)
        return settings
    }

    /// libmicrohttpd's messages for one listener, logged as warnings, one a second at most: a
    /// client can cause one with every request it garbles, or, with the process out of file
    /// descriptors, libmicrohttpd with every connection it fails to take.
    static func libraryLog(listener: String) -> @Sendable (String) -> Void {
        let throttle = LogThrottle(interval: .seconds(1))
        return { detail in
            guard let notLogged = throttle.admit(at: ContinuousClock.now) else { return }
            if notLogged == 0 {
                Log.warning("libmicrohttpd", ["listener": listener, "detail": detail])
            } else {
                Log.warning(
                    "libmicrohttpd", ["listener": listener, "detail": detail, "not_logged": String(notLogged)])
            }
        }
    }

    /// Blocks the calling thread (not one of Swift's pool) until every task has ended, or `limit` has passed.
    static func waitForEnd(of tasks: [Task<Void, Never>], atMost limit: Duration) {
        let ended = DispatchSemaphore(value: 0)
        Task.detached {
            for task in tasks { await task.value }
            ended.signal()
        }
        _ = ended.wait(timeout: .now() + .milliseconds(Int(clamping: limit.wholeMilliseconds)))
    }

    /// The address as bound: the configured one, with the port the system picked for port 0.
    private static func address(_ configured: ListenAddress, _ port: UInt16) -> String {
        guard configured.unixPath == nil else { return configured.description }
        var bound = configured
        bound.port = port
        return bound.description
    }
}
