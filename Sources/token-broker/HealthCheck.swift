import Dispatch
import Synchronization
import TokenBrokerCore
import TokenBrokerSources

/// `token-broker healthcheck [URL]`: exits 0 when `/healthz` answers 200, 1 otherwise.
///
/// For a container's HEALTHCHECK, so the image needs no curl. Without a URL it asks the admin
/// listener named by `TOKEN_BROKER_ADMIN_LISTEN` (or the default), with 0.0.0.0 read as loopback;
/// a `unix:` address is asked through its socket.
enum HealthCheck {
    static func run(arguments: [String]) -> Int32 {
        var url: String
        var unixSocketPath: String?
        if let given = arguments.first {
            url = given
        } else {
            let text = Environment.variables()["TOKEN_BROKER_ADMIN_LISTEN"] ?? BrokerConfiguration.defaultAdminListen
            guard var address = try? ListenAddress(parsing: text) else {
                Log.error("healthcheck: bad TOKEN_BROKER_ADMIN_LISTEN", ["value": text])
                return 1
            }
            if address.host == "0.0.0.0" { address.host = "127.0.0.1" }
            if address.host == "::" { address.host = "::1" }
            url = "http://\(address)/healthz"
            if let path = address.unixPath {
                unixSocketPath = path
                url = "http://localhost/healthz"
            }
        }
        var settings = UpstreamConfiguration()
        settings.connectTimeoutMsec = 2000
        settings.timeoutMsec = 3000
        var request = UpstreamRequest(method: "GET", url: url, settings: settings)
        request.unixSocketPath = unixSocketPath
        switch waitFor(request) {
        case .success(let response) where response.status == 200:
            return 0
        case .success(let response):
            Log.error("healthcheck failed", ["url": url, "status": String(response.status)])
            return 1
        case .failure(let error):
            Log.error("healthcheck failed", ["url": url, "problem": error.summary])
            return 1
        }
    }

    /// Sends one request and blocks the main thread until it is answered (this is a command, not the server).
    private static func waitFor(_ request: UpstreamRequest) -> Result<UpstreamResponse, TokenFetchError> {
        let outcome = Lock<Result<UpstreamResponse, TokenFetchError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let result: Result<UpstreamResponse, TokenFetchError>
            do throws(TokenFetchError) {
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
