import Testing
import TokenBrokerCore

@testable import token_broker

@Suite struct HealthCheckTests {
    private typealias Target = HealthCheck.Target

    @Test(arguments: [
        ("http://127.0.0.1:9090", "http://127.0.0.1:9090/healthz"),
        ("http://127.0.0.1:9090/", "http://127.0.0.1:9090/healthz"),
        ("http://127.0.0.1:9090/healthz", "http://127.0.0.1:9090/healthz"),
        ("http://[::1]:9090/readyz", "http://[::1]:9090/readyz"),
        ("HTTP://localhost:9090", "HTTP://localhost:9090/healthz"),
        // A Compose service's name, and no port (80), as before the user-info check.
        ("http://token_broker:9090/healthz", "http://token_broker:9090/healthz"),
        ("http://127.0.0.1", "http://127.0.0.1/healthz"), ("http://[::1]/readyz", "http://[::1]/readyz"),
    ])
    func aURLWithoutAPathAsksHealthz(_ given: String, _ url: String) {
        #expect(HealthCheck.target(given: given) == Target(url: url, unixSocketPath: nil))
    }

    @Test(arguments: [
        "ftp://127.0.0.1:1", "https://127.0.0.1:9090", "127.0.0.1:9090", "http://", "http:///healthz", "http://a b:1",
        "http://a:1/\r\n", "http://a:1/x\ny", "",
        // A user-info part would send the request to the host after "@"; no port, or another form.
        "http://127.0.0.1:18999@127.0.0.1:18702", "http://user@127.0.0.1:9090", "http://a:b@c:1/healthz",
        "http://127.0.0.1:", "http://127.0.0.1:0", "http://127.0.0.1:65536", "http://a:1x",
        "http://[zz]:1", "http://a%2e:1", "http://a\\b:1", "http://[::1]:9090:1", "http://[::1",
    ])
    func anythingElseIsRefused(_ given: String) {
        #expect(HealthCheck.target(given: given) == nil)
    }

    @Test func aUnixSocketIsAskedThroughItsFile() {
        #expect(
            HealthCheck.target(given: "unix:/run/broker/admin.sock")
                == Target(url: "http://localhost/healthz", unixSocketPath: "/run/broker/admin.sock"))
    }

    @Test(arguments: [
        ("0.0.0.0:9090", "http://127.0.0.1:9090/healthz"),
        ("[::]:9090", "http://[::1]:9090/healthz"),
        ("[0:0::0]:9090", "http://[::1]:9090/healthz"),
        ("10.1.2.3:9090", "http://10.1.2.3:9090/healthz"),
        ("[::1]:9091", "http://[::1]:9091/healthz"),
    ])
    func theConfiguredAdminListenerIsAskedOnLoopbackWhenItListensEverywhere(_ listen: String, _ url: String) throws {
        #expect(
            HealthCheck.target(adminListen: try ListenAddress(parsing: listen)) == Target(url: url, unixSocketPath: nil)
        )
    }

    @Test func portZeroIsKnownOnlyToTheBrokerSoItIsNoTarget() throws {
        #expect(HealthCheck.target(adminListen: try ListenAddress(parsing: "127.0.0.1:0")) == nil)
    }

    @Test func argumentsGiveAConfigFileAndAtMostOneAddress() throws {
        #expect(try HealthCheck.parse([]) == HealthCheck.Arguments())
        #expect(
            try HealthCheck.parse(["--config", "c.json", "unix:/s"])
                == HealthCheck.Arguments(configPath: "c.json", address: "unix:/s"))
        #expect(
            try HealthCheck.parse(["http://a:1", "--config=c.json"])
                == HealthCheck.Arguments(configPath: "c.json", address: "http://a:1"))
    }

    @Test(arguments: [
        (["--config"], "--config needs a file"),
        (
            ["--verbose"],
            "unknown argument \"--verbose\"; usage: token-broker healthcheck [--config FILE] [URL | unix:/path]"
        ),
        (
            ["http://a:1", "http://b:1"],
            "unknown argument \"http://b:1\"; usage: token-broker healthcheck [--config FILE] [URL | unix:/path]"
        ),
    ])
    func badArgumentsAreNamed(_ arguments: [String], _ problem: String) {
        #expect(throws: Options.Problem(description: problem)) { try HealthCheck.parse(arguments) }
    }

    @Test func badArgumentsAndAddressesFailWith1BeforeAskingAnything() {
        #expect(HealthCheck.run(arguments: ["--verbose"]) == 1)
        #expect(HealthCheck.run(arguments: ["ftp://127.0.0.1:1"]) == 1)
        #expect(Options.run(arguments: ["healthcheck", "--config"]) == 1)
    }
}
