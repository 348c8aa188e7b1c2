import Glibc
import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerSources

/// The command line: `token-broker [--config FILE] [--check-config] [--help] [--version]`
/// and `token-broker healthcheck [--config FILE] [URL | unix:/path]`; for scripts, `token-broker token`
/// and `token-broker status` (`CommandLineClient`).
enum Options {
    static let version = "0.1.0"

    static let help = """
        token-broker \(version): fetches access tokens, keeps a fresh one cached, serves it over HTTP.

        Usage:
          token-broker [--config FILE]      run the broker (no file: the embedded default)
          token-broker --check-config [--config FILE]
                                            check the configuration as start would (keys, caller
                                            keys file, listen addresses), short of binding
          token-broker healthcheck [--config FILE] [URL | unix:/path]
                                            exit 0 when the configured admin listener's /healthz
                                            answers 200 (or the one at URL; no path means /healthz)
          token-broker token [--provider NAME] [--audience A] [--scope S] [--resource R]
                             [--key-file FILE] [--config FILE | --address URL|unix:/path] [--timeout SEC]
                                            print the running broker's access token (only it) on stdout
          token-broker status [--config FILE | --address URL|unix:/path]
                                            print the running broker's providers as a table (from
                                            the admin listener's /readyz)
          token-broker reload [--config FILE | --address URL|unix:/path] [--timeout SEC]
                                            reload the running broker's configuration file, as
                                            SIGHUP does, and print what changed
          token-broker --help | --version   (token --help, status --help, reload --help: their own)

        Environment:
          TOKEN_BROKER_CONFIG         configuration file, when --config is not given
          TOKEN_BROKER_LISTEN         token listener, overriding the file (default 127.0.0.1:8080)
          TOKEN_BROKER_ADMIN_LISTEN   admin listener, overriding the file (default 127.0.0.1:9090)
                                      (any of these three set but empty is a configuration error)
          TOKEN_BROKER_CALLER_KEY_FILE  token: the caller key's file, when --key-file is not given

        Relative paths in the configuration file are read from the file's own directory.

        Token listener:
          GET  /token                 the current token (JSON)
          GET  /token/ready           long-poll: waits for a token newer than ?after=VERSION
          POST /token/refresh         the retrier: {"rejected_version": N} forces one refresh
          the same three for any provider under /providers/{name}/token...
          GET  /.well-known/jwks.json the local signer's public keys (public: no caller key)
          ANY  /proxy/{name}/{path}   proxy mode: forwarded to the proxy's target with a token
        Admin listener:
          GET  /healthz, /readyz, /metrics (Prometheus)
          POST /reload                reload the configuration file (as SIGHUP does)

        Signals: SIGTERM and SIGINT stop the broker; SIGHUP reloads its configuration file.

        Exit status:
          0  stopped by SIGTERM or SIGINT (after letting requests in flight finish, at most 5 s);
             the check or the health check passed
          1  cannot start: a listener cannot bind (port busy, socket path taken) or a system
             resource is missing; the health check failed
          2  bad command line or configuration (the message names the key or the file)
        token, status and reload (a failure is one line on stderr, never holding the token or the key):
          0  the token was printed; status: the broker answered, ready or not; reload: reloaded
          1  an answer that is not the broker's (or not /readyz's)
          2  bad command line or caller key file, or no listener to be read from the configuration
             (the file unreadable or not a JSON object, the listener not an address); the rest
             of the file is the broker's to check
          3  the broker is unreachable: nothing listens, or no answer in time
          4  token: the broker has no valid token now (503)
          5  token: the broker refused (400 bad value, 401 caller key, 403, 404 unknown provider);
             reload: the configuration was not reloaded (invalid, needs a restart, abandoned, or
             the broker is stopping)

        See README.md for the configuration reference.
        """

    /// What the command line asks for.
    enum Command: Equatable {
        /// `--help` or `-h`: print the usage.
        case help
        /// `--version`: print the version.
        case version
        /// Run the broker, or with `checkOnly` only check its configuration; the file from
        /// `--config`, when given.
        case broker(configPath: String?, checkOnly: Bool)
        /// `healthcheck`, with the arguments after it (`HealthCheck` reads them).
        case healthCheck(arguments: [String])
        /// `token`, with the arguments after it (`TokenCommand` reads them).
        case token(arguments: [String])
        /// `status`, with the arguments after it (`StatusCommand` reads them).
        case status(arguments: [String])
        /// `reload`, with the arguments after it (`ReloadCommand` reads them).
        case reload(arguments: [String])
    }

    /// Why a command line was refused, as the usage message says it.
    struct Problem: Error, Equatable, CustomStringConvertible {
        var description: String
    }

    /// Runs the command and returns the exit status.
    static func run(arguments: [String]) -> Int32 {
        let command: Command
        do {
            command = try parse(arguments)
        } catch {
            return usage(error.description)
        }
        switch command {
        case .help:
            print(help)
            return 0
        case .version:
            print("token-broker \(version)")
            return 0
        case .healthCheck(let arguments):
            return HealthCheck.run(arguments: arguments)
        case .token(let arguments):
            return TokenCommand.run(arguments: arguments)
        case .status(let arguments):
            return StatusCommand.run(arguments: arguments)
        case .reload(let arguments):
            return ReloadCommand.run(arguments: arguments)
        case .broker(let configPath, let checkOnly):
            let environment = Environment.variables()
            let path: String?
            let configuration: BrokerConfiguration
            do {
                path = try configurationPath(given: configPath, environment: environment)
                // At start, errors found past the JSON itself are logged in the format the file asks for.
                configuration = try load(path: path, environment: environment, appliesLogFormat: !checkOnly)
                if checkOnly { try check(configuration) }
            } catch {
                Log.error("invalid configuration", ["problem": error.description])
                return 2
            }
            guard checkOnly else { return Broker.run(configuration, path: path) }
            for warning in Broker.compatWarnings(configuration) { Log.warning("compat", ["problem": warning]) }
            for warning in Broker.templateWarnings(configuration) { Log.warning("template", ["problem": warning]) }
            print(
                "configuration OK: \(configuration.providers.count) provider(s), token listener \(configuration.listen), admin listener \(configuration.adminListen)"
            )
            return 0
        }
    }

    /// Reads the arguments in order: the first `--help` or `--version` wins, unless a bad
    /// argument comes before it.
    static func parse(_ arguments: [String]) throws(Problem) -> Command {
        switch arguments.first {
        case "healthcheck": return .healthCheck(arguments: Array(arguments.dropFirst()))
        case "token": return .token(arguments: Array(arguments.dropFirst()))
        case "status": return .status(arguments: Array(arguments.dropFirst()))
        case "reload": return .reload(arguments: Array(arguments.dropFirst()))
        default: break
        }
        var configPath: String?
        var checkOnly = false
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "--help", "-h":
                return .help
            case "--version":
                return .version
            case "--check-config":
                checkOnly = true
            case "--config":
                index += 1
                guard index < arguments.count else { throw Problem(description: "--config needs a file") }
                configPath = arguments[index]
            case _ where argument.hasPrefix("--config="):
                configPath = String(argument.dropFirst("--config=".count))
            default:
                throw Problem(description: "unknown argument \"\(argument)\"")
            }
            index += 1
        }
        return .broker(configPath: configPath, checkOnly: checkOnly)
    }

    /// The configuration file to read: the one given, else `TOKEN_BROKER_CONFIG`, else none (the
    /// embedded default). `TOKEN_BROKER_CONFIG` set but empty is an error, not the embedded default.
    static func configurationPath(given: String?, environment: [String: String]) throws(ConfigurationError)
        -> String?
    {
        if let given { return given }
        return try BrokerConfiguration.environmentValue(
            "TOKEN_BROKER_CONFIG", in: environment, unset: "the embedded default configuration")
    }

    /// `--check-config`: everything start does short of binding. The listen addresses are parsed
    /// whole by `load`; here the keys are read, the sources built, the caller keys file read and
    /// the token files' and the store's directories checked, and the store's key read.
    static func check(_ configuration: BrokerConfiguration) throws(ConfigurationError) {
        _ = try Broker.makeSources(configuration)
        _ = try Broker.loadCallerKeys(configuration)
        _ = try Broker.openSinkDirectories(configuration).get()
        _ = try Broker.readIdentityHeader(configuration)
        _ = try Broker.openStore(configuration, metrics: nil, connect: false).get()
    }

    /// Reads the file, if any, then applies the environment's overrides.
    ///
    /// With `appliesLogFormat` (at start), the file's `logFormat`, when it is a valid one, is used
    /// for every log line from the moment the file is parsed as JSON: an error in the rest of the
    /// file or in the environment's overrides is logged as the file asks. Never for a reload,
    /// which cannot change the log format (`Broker.restartNeeded`).
    static func load(path: String?, environment: [String: String], appliesLogFormat: Bool = false)
        throws(ConfigurationError) -> BrokerConfiguration
    {
        var configuration = BrokerConfiguration()
        if let path {
            let document = try document(at: path)
            if appliesLogFormat, let format = BrokerConfiguration.logFormat(in: document) { Log.use(format) }
            do {
                configuration = try BrokerConfiguration(document: document)
            } catch {
                throw ConfigurationError(key: error.key, "\(error.message) (in \(path))")
            }
            configuration.resolvePaths(relativeTo: BrokerConfiguration.directory(of: path))
            configuration.configurationFile = path
        }
        try configuration.applyEnvironment(environment)
        return configuration
    }

    /// The configuration file at `path`, parsed as JSON and not yet read as a configuration.
    static func document(at path: String) throws(ConfigurationError) -> JSONValue {
        let data: [UInt8]
        switch FileContents.read(path) {
        case .success(let bytes): data = bytes
        case .failure(let error):
            throw ConfigurationError(key: "", "cannot read configuration file \(path): \(error.reason)")
        }
        do {
            return try BrokerConfiguration.document(data)
        } catch {
            throw ConfigurationError(key: error.key, "\(error.message) (in \(path))")
        }
    }

    /// The listener a command asks (`healthcheck`, `token`, `status`, `reload`), found as the
    /// broker would find it, reading only what it needs: the environment's variable when it is
    /// set (then the file is not read at all); else the file's key
    /// (`BrokerConfiguration.listener(_:in:)`: the file must be a JSON object and the key, when
    /// given, a listen address; nothing else in it is read); else the default.
    static func listener(
        _ listener: BrokerConfiguration.Listener, configPath: String?, environment: [String: String]
    ) throws(ConfigurationError) -> ListenAddress {
        let path = try configurationPath(given: configPath, environment: environment)
        if let address = try BrokerConfiguration.listener(listener, environment: environment) { return address }
        guard let path else { return try BrokerConfiguration.listener(listener, in: nil) }
        let document = try document(at: path)
        do {
            return try BrokerConfiguration.listener(listener, in: document)
        } catch {
            throw ConfigurationError(key: error.key, "\(error.message) (in \(path))")
        }
    }

    private static func usage(_ problem: String) -> Int32 {
        Log.error("bad command line", ["problem": problem, "help": "token-broker --help"])
        return 2
    }
}
