import Glibc
import TokenBrokerCore

/// `token-broker reload`: asks the running broker's admin listener to reload its configuration
/// file (`POST /reload`, as SIGHUP does), waits for the reload to end, and prints one line: the
/// providers added, changed, removed and unchanged. Found as `status` finds the broker.
enum ReloadCommand {
    static let usage = "usage: token-broker reload [--config FILE | --address URL|unix:/path] [--timeout SEC]"

    static let help = """
        \(usage)

        Asks the running broker to read its configuration file again, as SIGHUP does, and prints
        what changed: the providers added, changed, removed and unchanged. It asks the admin
        listener's POST /reload, and waits for the reload to end (a changed provider's replacement
        may take up to the broker's reloadTimeoutSec to get its first token).

          --config FILE     the configuration whose admin listener to ask (its adminListen as the
                            file says now); else TOKEN_BROKER_CONFIG, with TOKEN_BROKER_ADMIN_LISTEN
                            applied over it. Of the file only adminListen and reloadTimeoutSec are
                            read: the broker checks the rest, and refuses an invalid file (exit 5)
          --address ADDR    ask http://HOST[:PORT] or unix:/path instead
          --timeout SEC     the longest wait for the answer, 1-660; by default the reloadTimeoutSec of
                            the configuration read, and 60 s more (default 90); with --address, 660

        Exit status: 0 reloaded; 1 an answer that is not the broker's; 2 a bad command line, or no
        admin listener to be read from the configuration; 3 the broker is unreachable; 5 not
        reloaded (the file is invalid, changes what needs a restart, or a replacement got no token
        in time: the broker runs as before; or the broker is stopping).
        """

    /// The time given, past `reloadTimeoutSec`, to read and check the file and answer.
    static let spareSec = 60

    /// The longest `--timeout`: the longest `reloadTimeoutSec` (600), and `spareSec`.
    static let longestTimeoutSec = 600 + spareSec

    /// What the arguments ask for: the admin listener's, and the longest wait, when given.
    struct Arguments: Equatable {
        var help = false
        var configPath: String?
        var address: String?
        var timeoutSec: Int?
    }

    static func parse(_ arguments: [String]) throws(Options.Problem) -> Arguments {
        let found = try CommandLineClient.flags(arguments, valued: ["config", "address", "timeout"], usage: usage)
        var parsed = Arguments(help: found["help"] != nil, configPath: found["config"], address: found["address"])
        if let text = found["timeout"] {
            guard let seconds = Int(text), (1...longestTimeoutSec).contains(seconds) else {
                throw Options.Problem(
                    description: "--timeout \(JSONText.quoted(text)) is not whole seconds 1-\(longestTimeoutSec)")
            }
            parsed.timeoutSec = seconds
        }
        return parsed
    }

    /// The longest wait for the answer: `--timeout`; else the `reloadTimeoutSec` of the
    /// configuration read to find the broker (the file the broker reloads, when it is the same),
    /// and `spareSec`; else, with `--address`, or when that file gives no valid value (or cannot
    /// be read), `longestTimeoutSec`, which covers any reload. Of the file only
    /// `reloadTimeoutSec` is read here, leniently (`BrokerConfiguration.reloadTimeoutSec(in:)`).
    static func timeoutSec(_ given: Arguments, environment: [String: String]) -> Int {
        if let seconds = given.timeoutSec { return seconds }
        guard given.address == nil else { return longestTimeoutSec }
        let document: JSONValue?
        do {
            document = try Options.configurationPath(given: given.configPath, environment: environment).map {
                (path) throws(ConfigurationError) in try Options.document(at: path)
            }
        } catch {
            return longestTimeoutSec
        }
        guard let seconds = BrokerConfiguration.reloadTimeoutSec(in: document) else { return longestTimeoutSec }
        return seconds + spareSec
    }

    /// `POST /reload`'s 200 body as one line; nil when it is not that answer's shape.
    static func summary(_ body: [UInt8]) -> String? {
        guard case .object(let root)? = try? JSONValue(parsing: body), case .bool(true)? = root["reloaded"] else {
            return nil
        }
        var parts: [String] = []
        for key in ["added", "changed", "removed", "unchanged"] {
            guard case .array(let items)? = root[key] else { return nil }
            var names: [String] = []
            for item in items {
                guard case .string(let name) = item else { return nil }
                names.append(CommandLineClient.oneLine(name, limit: 64))
            }
            parts.append("\(key): " + (names.isEmpty ? "-" : names.joined(separator: ", ")))
        }
        return "reloaded; " + parts.joined(separator: "; ")
    }

    /// Said when nothing answers at the admin listener found in the configuration file: the
    /// address is the file's as it is now, which a reload that changes `adminListen` (refused:
    /// it needs a restart) makes another than the running broker's, which then never hears of it.
    static let fileAddressHint =
        " (asked at the adminListen the configuration gives now: if it changed since the broker started,"
        + " which needs a restart, give the broker's address with --address)"

    /// The `error` codes of a reload that did not take (`ErrorAnswer`). Besides, a 503
    /// `shutting_down`: the broker is stopping, and the reload does not run.
    static let notReloaded = ["invalid_configuration", "reload_refused", "reload_abandoned"]

    /// The `error` member of a JSON error answer.
    private static func errorCode(_ body: [UInt8]) -> String? {
        guard case .object(let members)? = try? JSONValue(parsing: body), case .string(let code)? = members["error"]
        else { return nil }
        return code
    }

    /// Asks the admin listener and prints the outcome; returns the exit status.
    static func run(arguments: [String], environment: [String: String] = Environment.variables()) -> Int32 {
        CommandLineClient.run("reload", arguments, help: help, parse: parse, asksForHelp: \.help) {
            (given, _: inout [String]) throws(CommandLineClient.Failure) -> Int32 in
            let endpoint = try CommandLineClient.endpoint(
                address: given.address, configPath: given.configPath, listener: .admin, path: "/reload",
                environment: environment)
            let response = try CommandLineClient.ask(
                endpoint, method: "POST", headers: [("Token-Broker-Request", "true")],
                timeoutMsec: timeoutSec(given, environment: environment) * 1000,
                maxResponseBytes: 1 << 20
            ).mapError { failure in
                // Only when nothing listens there: a broker that does not answer in time is
                // found, and busy (a reload that waits for tokens), not at another address.
                guard failure.nothingListens, given.address == nil else { return failure }
                return CommandLineClient.Failure(failure.exit, failure.reason + fileAddressHint)
            }.get()
            let reason = CommandLineClient.brokerError(status: response.status, body: response.body)
            // Every answer of POST /reload is the broker's JSON (`application/json`).
            guard CommandLineClient.brokerDocument(response) != nil else {
                throw CommandLineClient.notTheBrokers(response, shown: endpoint.shown, listener: .admin)
            }
            switch response.status {
            case 200:
                guard let line = summary(response.body) else {
                    throw .init(.unexpectedAnswer, "\(endpoint.shown) gave no reload answer (\(reason))")
                }
                guard CommandLineClient.write(line + "\n", to: 1) else {
                    throw .init(.unexpectedAnswer, "cannot write to stdout: \(String(cString: strerror(errno)))")
                }
                return 0
            case _ where notReloaded.contains(errorCode(response.body) ?? ""):
                throw .init(.refused, "not reloaded: \(reason)")
            case 503 where errorCode(response.body) == "shutting_down":
                // The broker's own answer while it stops: a reload asked then never runs.
                throw .init(.refused, "not reloaded: the broker is stopping (\(reason))")
            default:
                throw .init(
                    .unexpectedAnswer,
                    "\(endpoint.shown) gave no reload answer (\(reason)); is it the broker's admin listener?")
            }
        }
    }
}
