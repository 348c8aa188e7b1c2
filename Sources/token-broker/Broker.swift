import Dispatch
import TokenBrokerCore
import TokenBrokerAPI
import TokenBrokerServer
import TokenBrokerProxy
import TokenBrokerSources
import TokenBrokerCrypto
import TokenBrokerUpstream

/// Wires the configuration into sources, providers and the two listeners; runs until a stop signal.
enum Broker {
    /// The sources for each provider, in order. Loads key files; generates keys where none is given.
    static func makeSources(_ configuration: BrokerConfiguration) throws(ConfigurationError) -> [(any TokenSource, JWTSigner?)] {
        var sources: [(any TokenSource, JWTSigner?)] = []
        for (index, provider) in configuration.providers.enumerated() {
            switch provider.source {
            case .jwt(let settings):
                do {
                    let signer = try JWTSigner(configuration: settings)
                    sources.append((signer, signer))
                } catch {
                    throw ConfigurationError(key: "providers[\(index)].source", error.detail)
                }
            case .file(let settings):
                sources.append((FileTokenSource(configuration: settings), nil))
            case .oauth2(let settings):
                do {
                    sources.append((try OAuth2TokenSource(configuration: settings), nil))
                } catch {
                    throw ConfigurationError(key: "providers[\(index)].source", error.detail)
                }
            case .http(let settings):
                sources.append((HTTPTokenSource(configuration: settings), nil))
            }
        }
        return sources
    }

    static func run(_ configuration: BrokerConfiguration) -> Int32 {
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
        for (settings, (_, signer)) in zip(configuration.providers, sources) {
            if let signer {
                Log.info("local signer ready", [
                    "provider": settings.name, "algorithm": signer.configuration.algorithm.rawValue, "kid": signer.keyID,
                    "key": signer.configuration.keyFile ?? "generated at start",
                ])
            }
        }
        for (path, mode) in SecretFilePermissions.exposed(configuration.providers.flatMap(\.source.secretFiles)) {
            Log.warning("a secret file can be read by other users; consider chmod 600", ["path": path, "mode": mode])
        }
        var callers: CallerKeyStore?
        if let path = configuration.clientKeysFile {
            do {
                callers = try CallerKeyStore(path: path, knownProviders: Set(configuration.providers.map(\.name)))
            } catch {
                Log.error("invalid configuration", ["problem": error.description])
                return 2
            }
            Log.info("caller keys loaded", ["file": path, "callers": String(callers!.count)])
            callers!.watch { result in
                switch result {
                case .success(let count): Log.info("caller keys reloaded", ["file": path, "callers": String(count)])
                case .failure(let error): Log.error("caller keys not reloaded; the previous list stays", ["problem": error.description])
                }
            }
        }
        let metrics = BrokerMetrics(version: Options.version)
        let events = ProviderEvents(
            fetched: { name, result, elapsed in
                metrics.recordFetch(provider: name, error: result.failure, duration: elapsed)
                if case .success(let (token, _)) = result, let status = token.upstreamStatus {
                    metrics.recordUpstreamStatus(provider: name, code: status)
                }
                switch result {
                case .success(let (token, version)):
                    Log.info("token fetched", [
                        "provider": name, "version": String(version), "token": Fingerprint.of(token.accessToken),
                        "lifetime_s": token.lifetime.map { String($0.components.seconds) } ?? "none",
                        "took_ms": String(elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000),
                    ])
                case .failure(let error):
                    Log.warning("token fetch failed", ["provider": name, "error": error.description, "detail": error.detail])
                }
            },
            excessiveRefresh: { name in Log.warning("forced refresh refused: too many in the window", ["provider": name]) })
        let providers = zip(configuration.providers, sources).map { settings, source in
            TokenProvider(configuration: settings, source: source.0, events: events)
        }
        let jwks = JWTSigner.jwks(sources.compactMap(\.1))

        let openFiles = ProcessLimits.raiseOpenFileLimit()
        if openFiles < UInt64(configuration.connectionLimit) + 64 {
            Log.warning("the open-file limit is below the connection limit", [
                "open_files": String(openFiles), "connectionLimit": String(configuration.connectionLimit),
            ])
        }
        let tokenServer: HTTPServer
        let adminServer: HTTPServer
        do {
            var tokenSettings = HTTPServer.Configuration(address: configuration.listen)
            tokenSettings.connectionLimit = configuration.connectionLimit
            tokenSettings.connectionTimeoutSec = configuration.connectionTimeoutSec
            tokenSettings.connectionMemoryLimit = configuration.connectionMemoryKiB * 1024
            tokenSettings.unixSocketMode = configuration.unixSocketMode
            tokenSettings.libraryLog = { Log.warning("libmicrohttpd", ["listener": "token", "detail": $0]) }
            if !configuration.proxies.isEmpty { tokenSettings.streamingPrefix = ProxyPath.prefix }
            let proxy = configuration.proxies.isEmpty ? nil : ProxyAPI(
                proxies: configuration.proxies, providers: providers, maxWait: .seconds(configuration.maxWaitSec),
                callerKeysInAuthorization: callers != nil, metrics: metrics)
            tokenServer = try HTTPServer(
                configuration: tokenSettings,
                handler: TokenAPI(
                    providers: providers, jwks: jwks, maxWait: .seconds(configuration.maxWaitSec),
                    requestGuard: configuration.requestGuard, callers: callers, proxy: proxy, metrics: metrics))
            var adminSettings = HTTPServer.Configuration(address: configuration.adminListen)
            adminSettings.connectionLimit = 256
            adminSettings.connectionTimeoutSec = configuration.connectionTimeoutSec
            adminSettings.threads = 1
            adminSettings.unixSocketMode = configuration.unixSocketMode
            adminSettings.libraryLog = { Log.warning("libmicrohttpd", ["listener": "admin", "detail": $0]) }
            adminServer = try HTTPServer(configuration: adminSettings, handler: AdminAPI(providers: providers, metrics: metrics))
        } catch {
            Log.error("cannot start", ["problem": error.description])
            return 1
        }
        // Weakly: a server's routes hold the metrics, so a strong capture would be a cycle.
        metrics.observeOpenConnections(listener: "token") { [weak tokenServer] in tokenServer?.openConnections ?? 0 }
        metrics.observeOpenConnections(listener: "admin") { [weak adminServer] in adminServer?.openConnections ?? 0 }
        metrics.observeEvictedConnections(listener: "token") { [weak tokenServer] in tokenServer?.evictedConnections ?? 0 }
        metrics.observeEvictedConnections(listener: "admin") { [weak adminServer] in adminServer?.evictedConnections ?? 0 }
        metrics.observeDroppedResponseHeaders { HTTPResponse.droppedHeaders }
        let tasks = providers.map { provider in Task.detached { await provider.run() } }
        Log.info("listening", ["listener": "token", "address": address(configuration.listen, tokenServer.port)])
        Log.info("listening", ["listener": "admin", "address": address(configuration.adminListen, adminServer.port)])
        for proxy in configuration.proxies {
            Log.info("proxy ready", [
                "proxy": proxy.name, "target": proxy.target.description,
                "provider": proxy.provider ?? configuration.providers[0].name,
            ])
        }
        if !configuration.requestGuard {
            Log.warning("the request guard is off: token routes accept requests without Token-Broker-Request")
        }
        if !configuration.listen.isLoopback, callers == nil {
            Log.warning("the token listener is reachable from other machines and callers need no key (see clientKeysFile)", ["address": configuration.listen.description])
        }

        let signal = Signals.waitForStop()
        Log.info("stopping", ["signal": signal])
        // Waiters learn first (503 shutting_down), then the listeners drain and stop.
        for provider in providers { provider.shutDown() }
        tokenServer.shutDown(grace: .seconds(5))
        adminServer.shutDown(grace: .seconds(1))
        for task in tasks { task.cancel() }
        callers?.stop()
        // A provider's task ends once its fetch has: a fetch still running at exit would call
        // OpenSSL after exit has torn it down (ThreadSanitizer saw EVP_Digest crash so).
        waitForEnd(of: tasks, atMost: .seconds(5))
        Log.info("stopped")
        return 0
    }

    /// Why the HTTP client for issuers and proxy targets cannot run, when the configuration needs it.
    private static func httpClientFailure(_ configuration: BrokerConfiguration) -> String? {
        let needed = !configuration.proxies.isEmpty || configuration.providers.contains { provider in
            switch provider.source {
            case .oauth2, .http: true
            case .jwt, .file: false
            }
        }
        return needed ? UpstreamHTTPClient.shared.startFailure : nil
    }

    /// Blocks the calling thread (not one of Swift's pool) until every task has ended, or `limit` has passed.
    private static func waitForEnd(of tasks: [Task<Void, Never>], atMost limit: Duration) {
        let ended = DispatchSemaphore(value: 0)
        Task.detached {
            for task in tasks { await task.value }
            ended.signal()
        }
        _ = ended.wait(timeout: .now() + .milliseconds(Int(limit.components.seconds) * 1000))
    }

    private static func address(_ configured: ListenAddress, _ port: UInt16) -> String {
        guard configured.unixPath == nil else { return configured.description }
        var bound = configured
        bound.port = port
        return bound.description
    }
}
