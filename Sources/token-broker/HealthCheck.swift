import Dispatch
import Synchronization
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerUpstream

/// `token-broker healthcheck [--config FILE] [ADDRESS]`: exits 0 when the broker's admin
/// listener answers `GET /healthz` with 200, 1 otherwise.
///
/// For a container's HEALTHCHECK, so the image needs no curl. Without an address it asks the
/// admin listener of the configuration the broker itself would run: `TOKEN_BROKER_ADMIN_LISTEN`,
/// else the `adminListen` of the file from `--config` or `TOKEN_BROKER_CONFIG`, 0.0.0.0 and `::`
/// read as loopback, and a `unix:` listener asked through its socket. So it checks the broker
/// the configuration describes, and never some other process on the default port. Of the file
/// only `adminListen` is read (`Options.listener`): a mistake saved elsewhere in it, which the
/// running broker has not loaded, does not fail the check of a broker that is healthy.
///
/// An address may be given instead: a URL (`http://127.0.0.1:9090`, where no path means
/// `/healthz`) or `unix:/path/to/admin.sock`.
enum HealthCheck {
    /// Where to ask: the URL, and the Unix socket to connect through, if any.
    struct Target: Equatable {
        var url: String
        var unixSocketPath: String?
    }

    /// What the arguments give: the configuration file, and the address to ask, if any.
    struct Arguments: Equatable {
        var configPath: String?
        var address: String?
    }

    /// Asks the admin listener and returns the exit status: 0 when it answers 200, else 1.
    static func run(arguments: [String]) -> Int32 {
        let given: Arguments
        do {
            given = try parse(arguments)
        } catch {
            return fail(error.description)
        }
        let target: Target
        if let address = given.address {
            guard let parsed = Self.target(given: address) else {
                return fail("\"\(address)\" is neither an http:// URL nor unix:/path")
            }
            target = parsed
        } else {
            let environment = Environment.variables()
            let adminListen: ListenAddress
            do {
                adminListen = try Options.listener(
                    .adminListen, configPath: given.configPath, environment: environment)
            } catch {
                return fail("invalid configuration: \(error.description)")
            }
            guard let found = Self.target(adminListen: adminListen) else {
                return fail("the admin listener \(adminListen) has port 0 (picked at start); give the address")
            }
            target = found
        }
        var settings = UpstreamConfiguration()
        settings.connectTimeoutMsec = 2000
        settings.timeoutMsec = 3000
        var request = UpstreamRequest(method: "GET", url: target.url, settings: settings)
        request.unixSocketPath = target.unixSocketPath
        // Directly: a proxy from the environment (http_proxy), which libcurl would use even for
        // 127.0.0.1, would answer for the broker, or fail it.
        request.bypassesProxies = true
        let asked = target.unixSocketPath.map { "unix:" + $0 } ?? target.url
        switch waitFor(request) {
        case .success(let response) where response.status == 200:
            return 0
        case .success(let response):
            Log.error("healthcheck failed", ["address": asked, "status": String(response.status)])
            return 1
        case .failure(let error):
            Log.error("healthcheck failed", ["address": asked, "problem": TokenFetchError(error).summary])
            return 1
        }
    }

    /// Reads `[--config FILE] [URL | unix:/path]`, in any order; at most one address.
    static func parse(_ arguments: [String]) throws(Options.Problem) -> Arguments {
        var parsed = Arguments()
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--config" {
                index += 1
                guard index < arguments.count else { throw Options.Problem(description: "--config needs a file") }
                parsed.configPath = arguments[index]
            } else if argument.hasPrefix("--config=") {
                parsed.configPath = String(argument.dropFirst("--config=".count))
            } else if argument.hasPrefix("-") || parsed.address != nil {
                throw Options.Problem(
                    description:
                        "unknown argument \"\(argument)\"; usage: token-broker healthcheck [--config FILE] [URL | unix:/path]"
                )
            } else {
                parsed.address = argument
            }
            index += 1
        }
        return parsed
    }

    /// The admin listener as something to connect to; nil for port 0, which only the broker knows.
    static func target(adminListen: ListenAddress) -> Target? { target(listen: adminListen, path: "/healthz") }

    /// A listener of the configuration as something to connect to, asking `path` (empty, or
    /// starting with `/`) there: 0.0.0.0 and `::` read as loopback, a `unix:` listener asked
    /// through its socket. Nil for port 0, which only the broker knows. Shared with the command
    /// line client (`token-broker token`, `token-broker status`).
    static func target(listen: ListenAddress, path: String) -> Target? {
        var address = listen
        if let socket = address.unixPath { return Target(url: "http://localhost" + path, unixSocketPath: socket) }
        guard address.port != 0 else { return nil }
        if address.host == "0.0.0.0" { address.host = "127.0.0.1" }
        if address.isIPv6, address.host == "::" || address.host.allSatisfy({ $0 == "0" || $0 == ":" }) {
            address.host = "::1"
        }
        return Target(url: "http://\(address)" + path, unixSocketPath: nil)
    }

    /// An address from the command line: `unix:/path`, or an http URL (no path means `/healthz`).
    static func target(given text: String) -> Target? {
        guard let (origin, path) = origin(given: text) else { return nil }
        var target = origin
        target.url += path.isEmpty || path == "/" ? "/healthz" : path
        return target
    }

    /// An address from the command line, split in two: where to connect (the URL up to its path,
    /// or `http://localhost` through a `unix:` socket), and the URL's path, empty when it has none.
    /// Nil for anything but `unix:/path` and an `http://HOST[:PORT]` URL, with or without a path:
    /// HOST a name (`_` allowed), an IPv4 address or an IPv6 one in brackets, PORT 1 to 65535
    /// (80 when left out). A user-info part
    /// (`http://a:1@b:2`, which would connect to `b` and hand it the request, caller key and all)
    /// or any other form is refused, not passed to libcurl to read its own way. Shared with the
    /// command line client, which asks paths of its own.
    static func origin(given text: String) -> (origin: Target, path: Substring)? {
        if text.hasPrefix("unix:") {
            guard let address = try? ListenAddress(parsing: text), let origin = target(listen: address, path: "")
            else { return nil }
            return (origin, "")
        }
        // By scalar: "\r\n" is one Character, equal to neither "\r" nor "\n".
        guard text.lowercased().hasPrefix("http://"),
            !text.unicodeScalars.contains(where: { $0 == " " || $0 == "\r" || $0 == "\n" })
        else {
            return nil
        }
        let rest = text.dropFirst("http://".count)
        guard let slash = rest.firstIndex(of: "/") else {
            guard URLAuthority.isHostAndPort(rest) else { return nil }
            return (Target(url: text), "")
        }
        guard URLAuthority.isHostAndPort(rest[..<slash]) else { return nil }
        return (Target(url: String(text[..<slash])), rest[slash...])
    }

    private static func fail(_ problem: String) -> Int32 {
        Log.error("healthcheck failed", ["problem": problem])
        return 1
    }

    /// Sends one request and blocks the main thread until it is answered (this is a command, not
    /// the server). Shared with the command line client.
    static func waitFor(_ request: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        let outcome = Lock<Result<UpstreamResponse, UpstreamError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let result: Result<UpstreamResponse, UpstreamError>
            do throws(UpstreamError) {
                result = .success(try await UpstreamHTTPClient.shared.send(request))
            } catch {
                result = .failure(error)
            }
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return outcome.withLock { $0! }
    }
}
