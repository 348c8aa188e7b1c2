import Glibc
import TokenBrokerCore

/// `token-broker reload`: asks the running broker's admin listener to reload its configuration
/// file (`POST /reload`, as SIGHUP does), waits for the reload to end, and prints one line: the
/// providers added, changed, removed and unchanged. Found as `status` finds the broker.
enum ReloadCommand {
    static let usage = "usage: token-broker reload [--config FILE | --address URL|unix:/path]"

    static let help = """
        \(usage)

        Asks the running broker to read its configuration file again, as SIGHUP does, and prints
        what changed: the providers added, changed, removed and unchanged. It asks the admin
        listener's POST /reload, and waits for the reload to end (a changed provider's replacement
        may take up to the broker's reloadTimeoutSec to get its first token).

          --config FILE     the configuration whose admin listener to ask; else TOKEN_BROKER_CONFIG,
                            with TOKEN_BROKER_ADMIN_LISTEN applied over it
          --address ADDR    ask http://HOST:PORT or unix:/path instead

        Exit status: 0 reloaded; 1 an answer that is not the broker's; 2 a bad command line or
        configuration; 3 the broker is unreachable; 5 not reloaded (the file is invalid, changes
        what needs a restart, or a replacement got no token in time): the broker runs as before.
        """

    /// The longest wait for the answer: the longest `reloadTimeoutSec`, and time to spare.
    static let timeoutMsec = 660_000

    typealias Arguments = CommandLineClient.AdminArguments

    static func parse(_ arguments: [String]) throws(Options.Problem) -> Arguments {
        try Arguments(arguments, usage: usage)
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

    /// The `error` codes of a reload that did not take (`ErrorAnswer`).
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
                endpoint, method: "POST", headers: [("Token-Broker-Request", "true")], timeoutMsec: timeoutMsec,
                maxResponseBytes: 1 << 20
            ).get()
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
            default:
                throw .init(
                    .unexpectedAnswer,
                    "\(endpoint.shown) gave no reload answer (\(reason)); is it the broker's admin listener?")
            }
        }
    }
}
