#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import TokenBrokerCore
import TokenBrokerSources

/// `token-broker healthcheck [URL]`: exits 0 when `/healthz` answers 200, 1 otherwise.
///
/// For a container's HEALTHCHECK, so the image needs no curl. Without a URL it asks the admin
/// listener named by `TOKEN_BROKER_ADMIN_LISTEN` (or the default), with 0.0.0.0 read as loopback.
enum HealthCheck {
    static func run(arguments: [String]) -> Int32 {
        let url: String
        if let given = arguments.first {
            url = given
        } else {
            let text = ProcessInfo.processInfo.environment["TOKEN_BROKER_ADMIN_LISTEN"] ?? BrokerConfiguration.defaultAdminListen
            guard var address = try? ListenAddress(parsing: text) else {
                Log.error("healthcheck: bad TOKEN_BROKER_ADMIN_LISTEN", ["value": text])
                return 1
            }
            if address.host == "0.0.0.0" { address.host = "127.0.0.1" }
            if address.host == "::" { address.host = "::1" }
            url = "http://\(address)/healthz"
        }
        do {
            let response = try CurlRequest.get(url, timeoutMilliseconds: 3000)
            guard response.status == 200 else {
                Log.error("healthcheck failed", ["url": url, "status": String(response.status)])
                return 1
            }
            return 0
        } catch {
            Log.error("healthcheck failed", ["url": url, "problem": error.summary])
            return 1
        }
    }
}
