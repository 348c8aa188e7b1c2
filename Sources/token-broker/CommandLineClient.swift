import Glibc
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerUpstream

/// `token-broker token`, `status` and `reload`: the running broker, asked from a script.
///
/// - `token [--provider NAME] [--audience A] [--scope S] [--resource R]` asks the token listener
///   for `/token` (or `/providers/{name}/token`), and prints the bare access token and a newline
///   on stdout, nothing else.
/// - `status` asks the admin listener's `/readyz`, and prints the providers as a table.
/// - `reload` asks the admin listener's `POST /reload` (`ReloadCommand`).
///
/// Each finds the broker as `healthcheck` does (`HealthCheck.target(listen:path:)`): the listener
/// of the configuration the broker itself would run (`TOKEN_BROKER_LISTEN` or
/// `TOKEN_BROKER_ADMIN_LISTEN`, else the key of the file `--config` or `TOKEN_BROKER_CONFIG`
/// names; 0.0.0.0 and `::` read as loopback; `unix:` listeners through their socket), or the one
/// `--address` names. Of the file only that key is read (`Options.listener`): a mistake elsewhere
/// in it is the running broker's to find at its next reload, and does not keep a script from
/// its token. A failure
/// is one line on stderr and an exit status that says which (`Exit`); that line never holds the
/// token or the caller key.
enum CommandLineClient {
    /// The exit statuses of both commands, as `Options.help` lists them.
    enum Exit: Int32, Equatable {
        case ok = 0
        /// Anything else: an answer that is not the broker's (an unexpected status, a body that
        /// is not `application/json` or not the broker's shape, something that is not HTTP as a
        /// server speaks it), or the HTTP client failed.
        case unexpectedAnswer = 1
        /// A bad command line, configuration or caller key file.
        case usage = 2
        /// Nothing answered at the address: refused, no socket, the connection closed or reset
        /// with nothing heard, or no answer in time (`UpstreamError.isNoAnswer`).
        case unreachable = 3
        /// `token`: the broker has no valid token to give now (503).
        case noValidToken = 4
        /// `token`: the broker refused the request (4xx): a bad or disallowed value, a missing or
        /// wrong caller key, an unknown provider.
        case refused = 5
    }

    /// Why a command ends without its result: the exit status and the reason.
    struct Failure: Error, Equatable {
        var exit: Exit
        var reason: String
        /// Nothing answered at the address at all (refused, no route), as opposed to an answer
        /// that did not come in time: then the address itself may be the wrong one.
        var nothingListens = false

        init(_ exit: Exit, _ reason: String, nothingListens: Bool = false) {
            self.exit = exit
            self.reason = reason
            self.nothingListens = nothingListens
        }
    }

    /// The arguments of a command that asks the admin listener and takes no value of its own
    /// (`status`, `reload`): `--config FILE` or `--address ADDR`, and `--help`.
    struct AdminArguments: Equatable {
        var help = false
        var configPath: String?
        var address: String?

        init(help: Bool = false, configPath: String? = nil, address: String? = nil) {
            self.help = help
            self.configPath = configPath
            self.address = address
        }

        init(_ arguments: [String], usage: String) throws(Options.Problem) {
            let found = try CommandLineClient.flags(arguments, valued: ["config", "address"], usage: usage)
            self.init(help: found["help"] != nil, configPath: found["config"], address: found["address"])
        }
    }

    /// Which of the broker's listeners a command asks.
    enum Listener: String {
        case token, admin
    }

    /// Where to send a request: the target, and the address as the reason line shows it (no path
    /// nor query).
    struct Endpoint: Equatable {
        var target: HealthCheck.Target
        var shown: String
    }

    /// The longest reason line written, in characters.
    static let reasonLimit = 400

    // MARK: Arguments

    /// Reads `--name VALUE` and `--name=VALUE` for the names in `valued`; `--help` or `-h` gives
    /// `["help": ""]` at once. Each name at most once, and never with an empty value.
    static func flags(_ arguments: [String], valued: [String], usage: String) throws(Options.Problem) -> [String:
        String]
    {
        var found: [String: String] = [:]
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--help" || argument == "-h" { return ["help": ""] }
            var name = argument
            var value: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                value = String(argument[argument.index(after: equals)...])
            }
            guard name.hasPrefix("--"), valued.contains(String(name.dropFirst(2))) else {
                throw Options.Problem(description: "unknown argument \(JSONText.quoted(argument)); \(usage)")
            }
            let key = String(name.dropFirst(2))
            if value == nil {
                index += 1
                guard index < arguments.count else { throw Options.Problem(description: "\(name) needs a value") }
                value = arguments[index]
            }
            guard let value, !value.isEmpty else { throw Options.Problem(description: "\(name) needs a value") }
            guard found.updateValue(value, forKey: key) == nil else {
                throw Options.Problem(description: "\(name) is given twice")
            }
            index += 1
        }
        return found
    }

    // MARK: Finding the broker

    /// The listener to ask for `path` (which starts with `/`): the address given, else the
    /// configuration's `listener`.
    static func endpoint(
        address: String?, configPath: String?, listener: Listener, path: String, environment: [String: String]
    ) throws(Failure) -> Endpoint {
        let origin: HealthCheck.Target
        if let address {
            guard let (given, rest) = HealthCheck.origin(given: address), rest.isEmpty || rest == "/",
                !address.unicodeScalars.contains(where: { $0 == "?" || $0 == "#" })
            else {
                throw Failure(
                    .usage, "--address \(JSONText.quoted(address)) is neither http://HOST[:PORT] nor unix:/path")
            }
            origin = given
        } else {
            let listen: ListenAddress
            do {
                listen = try Options.listener(
                    listener == .token ? .listen : .adminListen, configPath: configPath, environment: environment)
            } catch {
                throw Failure(.usage, "invalid configuration: \(error.description)")
            }
            guard let found = HealthCheck.target(listen: listen, path: "") else {
                throw Failure(
                    .usage, "the \(listener.rawValue) listener \(listen) has port 0 (picked at start); give --address")
            }
            origin = found
        }
        let shown = origin.unixSocketPath.map { "unix:" + $0 } ?? origin.url
        return Endpoint(
            target: HealthCheck.Target(url: origin.url + path, unixSocketPath: origin.unixSocketPath), shown: shown)
    }

    // MARK: Asking

    /// Sends one request (a GET unless told) and waits for the answer, at most `timeoutMsec`
    /// (2 s of them to connect). A failure to connect or to hear back in time is `unreachable`;
    /// an answer that came but is not HTTP as a server speaks it (a garbage status line, a body
    /// cut short, headers past libcurl's limit) is `unexpectedAnswer`: something is there, and
    /// it is not the broker.
    static func ask(
        _ endpoint: Endpoint, method: String = "GET", headers: [(String, String)], timeoutMsec: Int,
        maxResponseBytes: Int
    ) -> Result<UpstreamResponse, Failure> {
        var settings = UpstreamConfiguration()
        settings.connectTimeoutMsec = min(2000, timeoutMsec)
        settings.timeoutMsec = timeoutMsec
        settings.maxResponseBytes = maxResponseBytes
        var request = UpstreamRequest(method: method, url: endpoint.target.url, headers: headers, settings: settings)
        request.unixSocketPath = endpoint.target.unixSocketPath
        // The broker is asked directly, never through an HTTP proxy from the environment
        // (http_proxy and the like): the request may carry a caller key, and its answer a token.
        request.bypassesProxies = true
        switch HealthCheck.waitFor(request) {
        case .success(let response):
            return .success(response)
        case .failure(.timeout(let detail)):
            return .failure(Failure(.unreachable, "broker did not answer in time at \(endpoint.shown): \(detail)"))
        case .failure(.unreachable(let detail)) where UpstreamError.unreachable(detail).isNoAnswer:
            return .failure(
                Failure(.unreachable, "broker unreachable at \(endpoint.shown): \(detail)", nothingListens: true))
        case .failure(.unreachable(let detail)), .failure(.badResponse(let detail)):
            return .failure(
                Failure(
                    .unexpectedAnswer,
                    "\(endpoint.shown) gave an answer that is not the broker's: not HTTP as a server speaks it (\(detail))"
                ))
        case .failure(.tooLarge(let limit)):
            return .failure(
                Failure(.unexpectedAnswer, "the answer from \(endpoint.shown) is larger than \(limit) bytes"))
        case .failure(let error):
            return .failure(
                Failure(.unexpectedAnswer, "cannot ask \(endpoint.shown): \(TokenFetchError(error).summary)"))
        }
    }

    /// The answer's JSON object when it can be the broker's: every answer the broker gives these
    /// commands is `Content-Type: application/json` with a JSON object for a body. Nil otherwise.
    static func brokerDocument(_ response: UpstreamResponse) -> [String: JSONValue]? {
        guard let type = response.headers["content-type"],
            type.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0].trimmingCharacters(in: " \t")
                .lowercased() == "application/json",
            case .object(let members)? = try? JSONValue(parsing: response.body)
        else { return nil }
        return members
    }

    /// Why `response` is not the broker's answer, as a failure (`unexpectedAnswer`): its status,
    /// and its `Content-Type` or that its body is not the broker's shape. `listener` names the
    /// listener that was meant.
    static func notTheBrokers(_ response: UpstreamResponse, shown: String, listener: Listener) -> Failure {
        let what: String
        if let type = response.headers["content-type"] {
            what =
                brokerDocument(response) == nil
                ? (type.lowercased().hasPrefix("application/json")
                    ? "a body that is not a JSON object" : "Content-Type \(type)")
                : "a body without the broker's fields"
        } else {
            what = "no Content-Type"
        }
        return Failure(
            .unexpectedAnswer,
            "\(shown) gave an answer that is not the broker's (HTTP \(response.status), \(what)); is it the broker's \(listener.rawValue) listener?"
        )
    }

    /// What a broker's error answer says: the status, and `error`, `error_description` and
    /// `parameter` when the body is the broker's JSON error shape.
    static func brokerError(status: Int, body: [UInt8]) -> String {
        guard case .object(let members)? = try? JSONValue(parsing: body), case .string(let code)? = members["error"]
        else {
            return "HTTP \(status)"
        }
        var text = "HTTP \(status) \(code)"
        if case .string(let description)? = members["error_description"], !description.isEmpty {
            text += ": " + description
        }
        if case .string(let parameter)? = members["parameter"] { text += " (parameter \(parameter))" }
        return text
    }

    // MARK: Output

    /// `text` on one line of printable ASCII: control characters (C0, DEL, C1, line and paragraph
    /// separators) as spaces, any other non-ASCII (format characters such as U+202E or U+200B,
    /// combining marks, letters) as `?`, each secret as `[hidden]`, cut to `limit` characters.
    /// The secrets are hidden before the characters are replaced, found in either case and
    /// through any character that is not visible ASCII (`String.hiding`), so through every one
    /// replaced here: a server that echoes the caller key with a zero-width space, a NUL or an
    /// escape inside it, or in capitals, does not get it printed.
    static func oneLine(_ text: String, hiding secrets: [String] = [], limit: Int = reasonLimit) -> String {
        var out = ""
        for scalar in text.hiding(secrets).unicodeScalars {
            let value = scalar.value
            let control = value < 0x20 || (0x7F...0x9F).contains(value) || value == 0x2028 || value == 0x2029
            out.unicodeScalars.append(control ? " " : value < 0x7F ? scalar : "?")
        }
        guard out.unicodeScalars.count > limit else { return out }
        return String(String.UnicodeScalarView(out.unicodeScalars.prefix(limit - 1))) + "…"
    }

    /// A duration in whole seconds as people read it: `42s`, `4m12s`, `2h0m5s`, `3d4h0m0s`;
    /// `expired` below zero.
    static func duration(seconds: Int64) -> String {
        guard seconds >= 0 else { return "expired" }
        let days = seconds / 86_400
        let hours = seconds / 3600 % 24
        let minutes = seconds / 60 % 60
        let rest = seconds % 60
        if days > 0 { return "\(days)d\(hours)h\(minutes)m\(rest)s" }
        if hours > 0 { return "\(hours)h\(minutes)m\(rest)s" }
        if minutes > 0 { return "\(minutes)m\(rest)s" }
        return "\(rest)s"
    }

    /// Rows as a fixed-width table: each column as wide as its widest cell, two spaces between
    /// columns, the last column unpadded (no trailing spaces); one line per row.
    static func table(_ rows: [[String]]) -> String {
        guard let columns = rows.map(\.count).max() else { return "" }
        var widths = [Int](repeating: 0, count: columns)
        for row in rows {
            for (column, cell) in row.enumerated() { widths[column] = max(widths[column], cell.count) }
        }
        var out = ""
        for row in rows {
            var line = ""
            for (column, cell) in row.enumerated() {
                line += cell
                if column < row.count - 1 { line += String(repeating: " ", count: widths[column] - cell.count + 2) }
            }
            out += line + "\n"
        }
        return out
    }

    /// Writes all of `text` to `descriptor`; false when it could not.
    @discardableResult
    static func write(_ text: String, to descriptor: Int32) -> Bool {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes {
                Glibc.write(descriptor, $0.baseAddress! + offset, $0.count - offset)
            }
            if written < 0, errno == EINTR { continue }
            guard written > 0 else { return false }
            offset += written
        }
        return true
    }

    /// A command's frame: its arguments read (a bad one: exit 2), `--help` printed, interruption
    /// allowed, then `body`, whose failure ends the command (`fail`) with the secrets it put in
    /// `hidden` kept out of the line.
    static func run<Arguments>(
        _ command: String, _ arguments: [String], help: String,
        parse: ([String]) throws(Options.Problem) -> Arguments, asksForHelp: (Arguments) -> Bool,
        _ body: (Arguments, _ hidden: inout [String]) throws(Failure) -> Int32
    ) -> Int32 {
        let given: Arguments
        do {
            given = try parse(arguments)
        } catch {
            return fail(command, .init(.usage, error.description))
        }
        if asksForHelp(given) {
            write(help + "\n", to: 1)
            return 0
        }
        allowInterruption()
        var hidden: [String] = []
        do throws(Failure) {
            return try body(given, &hidden)
        } catch {
            return fail(command, error, hiding: hidden)
        }
    }

    /// Ends a command with its failure: `token-broker COMMAND: reason`, one line on stderr.
    static func fail(_ command: String, _ failure: Failure, hiding secrets: [String] = []) -> Int32 {
        write("token-broker \(command): " + oneLine(failure.reason, hiding: secrets) + "\n", to: 2)
        return failure.exit.rawValue
    }

    /// Lets Ctrl-C, SIGTERM and SIGHUP end a client command at once: `main` blocked them for the
    /// broker, which takes them in `sigwait`; a command never does. Called before any thread starts.
    static func allowInterruption() {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGHUP)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// `text` percent-encoded but for RFC 3986's unreserved characters (`A–Z a–z 0–9 - . _ ~`),
    /// a space as `%20`: one piece of a path or a query value, whatever it holds.
    static func percentEncoded(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out += "%" + (byte < 16 ? "0" : "") + hex
            }
        }
        return out
    }
}

/// `token-broker token`: the bare access token, for scripts.
enum TokenCommand {
    static let usage =
        "usage: token-broker token [--provider NAME] [--audience A] [--scope S] [--resource R] [--key-file FILE] [--config FILE | --address URL|unix:/path] [--timeout SEC]"

    static let help = """
        \(usage)

        Prints the running broker's access token and a newline on stdout, nothing else. It asks
        the token listener for /token, or /providers/NAME/token with --provider; --audience,
        --scope and --resource are a template's values (a scope set space-separated, quoted).

          --key-file FILE   the caller key, one line (clientKeysFile); else TOKEN_BROKER_CALLER_KEY_FILE
          --config FILE     the configuration whose listener to ask; else TOKEN_BROKER_CONFIG, with
                            TOKEN_BROKER_LISTEN applied over it (0.0.0.0 and :: read as loopback)
          --address ADDR    ask http://HOST[:PORT] or unix:/path instead
          --timeout SEC     the longest wait for the answer, 1-120 (default 10)

        Exit status: 0 the token was printed; 1 an answer that is not the broker's; 2 a bad command
        line or key file, or no token listener to be read from the configuration (of the file only
        listen is read); 3 the broker is unreachable; 4 it has no valid token (503);
        5 it refused the request (400, 401, 403, 404). A failure is one line on stderr.
        """

    /// What the arguments ask for.
    struct Arguments: Equatable {
        var help = false
        var configPath: String?
        var address: String?
        var provider: String?
        var audience: String?
        var scope: String?
        var resource: String?
        var keyFile: String?
        var timeoutSec = 10
    }

    static func parse(_ arguments: [String]) throws(Options.Problem) -> Arguments {
        let found = try CommandLineClient.flags(
            arguments,
            valued: ["config", "address", "provider", "audience", "scope", "resource", "key-file", "timeout"],
            usage: usage)
        var parsed = Arguments()
        if found["help"] != nil {
            parsed.help = true
            return parsed
        }
        parsed.configPath = found["config"]
        parsed.address = found["address"]
        parsed.provider = found["provider"]
        parsed.audience = found["audience"]
        parsed.scope = found["scope"]
        parsed.resource = found["resource"]
        parsed.keyFile = found["key-file"]
        if let text = found["timeout"] {
            guard let seconds = Int(text), (1...120).contains(seconds) else {
                throw Options.Problem(description: "--timeout \(JSONText.quoted(text)) is not whole seconds 1-120")
            }
            parsed.timeoutSec = seconds
        }
        return parsed
    }

    /// The route and its query: `/token`, or `/providers/NAME/token`, with the values given,
    /// each percent-encoded whole.
    static func path(_ given: Arguments) -> String {
        var path = given.provider.map { "/providers/" + CommandLineClient.percentEncoded($0) + "/token" } ?? "/token"
        let values = [("audience", given.audience), ("scope", given.scope), ("resource", given.resource)]
            .compactMap { name, value in value.map { name + "=" + CommandLineClient.percentEncoded($0) } }
        if !values.isEmpty { path += "?" + values.joined(separator: "&") }
        return path
    }

    /// The caller key: from the file given, else from `TOKEN_BROKER_CALLER_KEY_FILE`, else none.
    /// One line of visible ASCII; trailing line breaks are dropped. A failure never shows the key.
    static func callerKey(file: String?, environment: [String: String]) throws(CommandLineClient.Failure)
        -> String?
    {
        let source: String
        let path: String
        if let file {
            (source, path) = ("--key-file", file)
        } else if let file = environment["TOKEN_BROKER_CALLER_KEY_FILE"], !file.isEmpty {
            (source, path) = ("TOKEN_BROKER_CALLER_KEY_FILE", file)
        } else {
            return nil
        }
        let key: String
        do {
            key = try SecretFile.readLine(path)
        } catch {
            throw .init(.usage, "caller key (\(source)): \(error.detail)")
        }
        guard key.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw .init(.usage, "caller key (\(source)): \(path) must hold one key of visible ASCII, without spaces")
        }
        return key
    }

    /// The token in the broker's answer, or why there is none. `shown` is the address asked.
    ///
    /// The broker answers `application/json`: a 200 with an `access_token`, or an error object
    /// with an `error` member. Anything else is not its answer (`unexpectedAnswer`), whatever
    /// the status, but for libmicrohttpd's own 414 and 431, which it gives without a body of its
    /// own for a request too large (a very long value), and which are a refusal.
    static func token(_ response: UpstreamResponse, shown: String) -> Result<String, CommandLineClient.Failure> {
        let status = response.status
        guard let members = CommandLineClient.brokerDocument(response) else {
            if status == 414 || status == 431 {
                return .failure(.init(.refused, "refused: HTTP \(status): the request is too large for the broker"))
            }
            return .failure(CommandLineClient.notTheBrokers(response, shown: shown, listener: .token))
        }
        let isError: Bool
        if case .string? = members["error"] { isError = true } else { isError = false }
        switch status {
        case 200:
            // What the broker serves is 1 to 16384 bytes of visible ASCII; anything else is not
            // its answer, and is not printed.
            guard case .string(let token)? = members["access_token"], (1...16_384).contains(token.utf8.count),
                token.utf8.allSatisfy({ (0x21...0x7E).contains($0) })
            else {
                return .failure(
                    .init(
                        .unexpectedAnswer,
                        "\(shown) answered 200 without a token answer; is it the broker's token listener?"))
            }
            return .success(token)
        case 503 where isError:
            return .failure(
                .init(
                    .noValidToken,
                    "no valid token: " + CommandLineClient.brokerError(status: status, body: response.body)))
        case 400..<500 where isError:
            var reason = "refused: " + CommandLineClient.brokerError(status: status, body: response.body)
            if status == 401 { reason += "; give the caller key with --key-file or TOKEN_BROKER_CALLER_KEY_FILE" }
            return .failure(.init(.refused, reason))
        case 400..<600 where !isError:
            return .failure(CommandLineClient.notTheBrokers(response, shown: shown, listener: .token))
        default:
            return .failure(
                .init(
                    .unexpectedAnswer,
                    "unexpected answer from \(shown): "
                        + CommandLineClient.brokerError(status: status, body: response.body)))
        }
    }

    /// Asks the broker and prints the token; returns the exit status.
    static func run(arguments: [String], environment: [String: String] = Environment.variables()) -> Int32 {
        CommandLineClient.run("token", arguments, help: help, parse: parse, asksForHelp: \.help) {
            (given, hidden: inout [String]) throws(CommandLineClient.Failure) -> Int32 in
            let key = try callerKey(file: given.keyFile, environment: environment)
            if let key { hidden.append(key) }
            let endpoint = try CommandLineClient.endpoint(
                address: given.address, configPath: given.configPath, listener: .token, path: path(given),
                environment: environment)
            var headers = [("Token-Broker-Request", "true")]
            if let key { headers.append(("Authorization", "Bearer " + key)) }
            let response = try CommandLineClient.ask(
                endpoint, headers: headers, timeoutMsec: given.timeoutSec * 1000, maxResponseBytes: 1 << 20
            ).get()
            let token = try token(response, shown: endpoint.shown).get()
            guard CommandLineClient.write(token + "\n", to: 1) else {
                throw .init(.unexpectedAnswer, "cannot write the token to stdout: \(String(cString: strerror(errno)))")
            }
            return 0
        }
    }
}

/// `token-broker status`: the providers' state, from the admin listener's `/readyz`.
enum StatusCommand {
    static let usage = "usage: token-broker status [--config FILE | --address URL|unix:/path]"

    static let help = """
        \(usage)

        Prints the running broker's providers as a table: NAME, STATE, VERSION, EXPIRES IN, STALE,
        LAST ERROR ("-" when none); then its templates, if any: TEMPLATE, CHILDREN, READY, MAX. It
        asks the admin listener's /readyz. Never a token.

          --config FILE     the configuration whose admin listener to ask; else TOKEN_BROKER_CONFIG,
                            with TOKEN_BROKER_ADMIN_LISTEN applied over it
          --address ADDR    ask http://HOST[:PORT] or unix:/path instead

        Exit status: 0 the broker answered (ready or not); 1 an answer that is not /readyz's;
        2 a bad command line, or no admin listener to be read from the configuration (of the file
        only adminListen is read); 3 the broker is unreachable.
        """

    typealias Arguments = CommandLineClient.AdminArguments

    static func parse(_ arguments: [String]) throws(Options.Problem) -> Arguments {
        try Arguments(arguments, usage: usage)
    }

    /// `/readyz`'s body as the tables; nil when it is not `/readyz`'s shape.
    static func tables(_ body: [UInt8]) -> String? {
        guard case .object(let root)? = try? JSONValue(parsing: body), case .array(let providers)? = root["providers"]
        else { return nil }
        var rows = [["NAME", "STATE", "VERSION", "EXPIRES IN", "STALE", "LAST ERROR"]]
        for entry in providers {
            guard case .object(let provider) = entry, case .string(let name)? = provider["name"] else { return nil }
            var state = "-"
            if case .string(let text)? = provider["state"] { state = text }
            var stale = "-"
            if case .bool(let flag)? = provider["stale"] { stale = flag ? "yes" : "no" }
            var lastError = "-"
            if case .string(let text)? = provider["last_error_description"] ?? provider["last_error"] {
                lastError = text
            }
            rows.append([
                cell(name), cell(state), whole(provider["version"]).map { String($0) } ?? "-",
                whole(provider["expires_in"]).map(CommandLineClient.duration) ?? "-", stale,
                CommandLineClient.oneLine(lastError, limit: 120),
            ])
        }
        var out = CommandLineClient.table(rows)
        if case .array(let templates)? = root["templates"], !templates.isEmpty {
            var templateRows = [["TEMPLATE", "CHILDREN", "READY", "MAX"]]
            for entry in templates {
                guard case .object(let template) = entry, case .string(let name)? = template["name"] else { return nil }
                templateRows.append(
                    [cell(name)]
                        + ["children", "ready", "max_children"].map { whole(template[$0]).map { String($0) } ?? "-" })
            }
            out += "\n" + CommandLineClient.table(templateRows)
        }
        return out
    }

    /// A whole number from the answer, when it is one exactly (never trapping); nil otherwise.
    private static func whole(_ value: JSONValue?) -> Int64? {
        guard case .number(let number)? = value else { return nil }
        return Int64(exactly: number.value)
    }

    /// A name or a state as a cell: one line, no space, at most 64 characters.
    private static func cell(_ text: String) -> String {
        let line = CommandLineClient.oneLine(text, limit: 64)
        return line.isEmpty ? "-" : String(line.map { $0 == " " ? "_" : $0 })
    }

    /// Asks the admin listener and prints the tables; returns the exit status.
    static func run(arguments: [String], environment: [String: String] = Environment.variables()) -> Int32 {
        CommandLineClient.run("status", arguments, help: help, parse: parse, asksForHelp: \.help) {
            (given, _: inout [String]) throws(CommandLineClient.Failure) -> Int32 in
            let endpoint = try CommandLineClient.endpoint(
                address: given.address, configPath: given.configPath, listener: .admin, path: "/readyz",
                environment: environment)
            let response = try CommandLineClient.ask(
                endpoint, headers: [], timeoutMsec: 5000, maxResponseBytes: 16 << 20
            ).get()
            guard CommandLineClient.brokerDocument(response) != nil else {
                throw CommandLineClient.notTheBrokers(response, shown: endpoint.shown, listener: .admin)
            }
            guard response.status == 200 || response.status == 503, let tables = tables(response.body) else {
                throw .init(
                    .unexpectedAnswer,
                    "\(endpoint.shown) gave no /readyz answer (\(CommandLineClient.brokerError(status: response.status, body: response.body))); is it the broker's admin listener?"
                )
            }
            guard CommandLineClient.write(tables, to: 1) else {
                throw .init(.unexpectedAnswer, "cannot write to stdout: \(String(cString: strerror(errno)))")
            }
            return 0
        }
    }
}
