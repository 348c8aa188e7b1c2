import Glibc
import TokenBrokerCore

/// The command line: `token-broker [--config FILE] [--check-config] [--help] [--version]`
/// and `token-broker healthcheck [URL]`.
enum Options {
    static let version = "0.1.0"

    static let help = """
        token-broker \(version): fetches access tokens, keeps a fresh one cached, serves it over HTTP.

        Usage:
          token-broker [--config FILE]      run the broker (no file: the embedded default)
          token-broker --check-config [--config FILE]
                                            check the configuration; exit 0 when valid, 2 otherwise
          token-broker healthcheck [URL]    exit 0 when the admin listener's /healthz answers 200
          token-broker --help | --version

        Environment:
          TOKEN_BROKER_CONFIG         configuration file, when --config is not given
          TOKEN_BROKER_LISTEN         token listener, overriding the file (default 127.0.0.1:8080)
          TOKEN_BROKER_ADMIN_LISTEN   admin listener, overriding the file (default 127.0.0.1:9090)

        The token listener serves GET /token and /.well-known/jwks.json; the admin listener
        serves GET /healthz and /readyz. See README.md for the configuration reference.
        """

    /// Runs the command and returns the exit status.
    static func run(arguments: [String]) -> Int32 {
        var configPath: String?
        var checkOnly = false
        var index = 0
        if arguments.first == "healthcheck" {
            return HealthCheck.run(arguments: Array(arguments.dropFirst()))
        }
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "--help", "-h":
                print(help)
                return 0
            case "--version":
                print("token-broker \(version)")
                return 0
            case "--check-config":
                checkOnly = true
            case "--config":
                index += 1
                guard index < arguments.count else { return usage("--config needs a file") }
                configPath = arguments[index]
            case _ where argument.hasPrefix("--config="):
                configPath = String(argument.dropFirst("--config=".count))
            default:
                return usage("unknown argument \"\(argument)\"")
            }
            index += 1
        }
        let environment = Environment.variables()
        let configuration: BrokerConfiguration
        do {
            configuration = try load(path: configPath ?? environment["TOKEN_BROKER_CONFIG"].flatMap { $0.isEmpty ? nil : $0 }, environment: environment)
        } catch {
            Log.error("invalid configuration", ["problem": error.description])
            return 2
        }
        if checkOnly {
            do {
                _ = try Broker.makeSources(configuration)
            } catch {
                Log.error("invalid configuration", ["problem": error.description])
                return 2
            }
            print("configuration OK: \(configuration.providers.count) provider(s), token listener \(configuration.listen), admin listener \(configuration.adminListen)")
            return 0
        }
        return Broker.run(configuration)
    }

    /// Reads the file, if any, then applies the environment's overrides.
    static func load(path: String?, environment: [String: String]) throws(ConfigurationError) -> BrokerConfiguration {
        var configuration = BrokerConfiguration()
        if let path {
            let data: [UInt8]
            switch FileContents.read(path) {
            case .success(let bytes): data = bytes
            case .failure(let error): throw ConfigurationError(key: "", "cannot read configuration file \(path): \(error.reason)")
            }
            do {
                configuration = try BrokerConfiguration(json: data)
            } catch {
                throw ConfigurationError(key: error.key, "\(error.message) (in \(path))")
            }
        }
        try configuration.applyEnvironment(environment)
        return configuration
    }

    private static func usage(_ problem: String) -> Int32 {
        Log.error("bad command line", ["problem": problem, "help": "token-broker --help"])
        return 2
    }
}
