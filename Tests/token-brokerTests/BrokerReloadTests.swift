import Testing
import TokenBrokerCore

@testable import token_broker

/// What a reload decides before it touches anything: which providers are unchanged, changed,
/// added and removed (`Broker.compare`), and which changes it refuses (`Broker.restartNeeded`).
/// The integration tests (test_reload.py) run it against a real broker and a real issuer.
@Suite struct BrokerReloadTests {
    private func providers(_ json: String) throws -> [(settings: ProviderConfiguration, digests: [[UInt8]?])] {
        try configuration(#"{"providers": \#(json)}"#).providers.map { ($0, Broker.credentialDigests($0)) }
    }

    @Test func providersAreComparedByNameAndByEverySetting() throws {
        let old = try providers(
            #"""
            [{"name": "keep", "source": {"type": "jwt", "audience": "a"}},
             {"name": "change", "source": {"type": "jwt", "audience": "b"}},
             {"name": "drop", "source": {"type": "jwt", "audience": "c"}},
             {"name": "tune", "source": {"type": "jwt"}, "tokenRefreshDelaySec": 300}]
            """#)
        let new = try providers(
            #"""
            [{"name": "add", "source": {"type": "jwt"}},
             {"name": "change", "source": {"type": "jwt", "audience": "b2"}},
             {"name": "tune", "source": {"type": "jwt"}, "tokenRefreshDelaySec": 301},
             {"name": "keep", "source": {"type": "jwt", "audience": "a"}}]
            """#)
        let summary = Broker.compare(old: old, new: new)
        #expect(summary.added == ["add"])
        #expect(summary.changed == ["change", "tune"])
        #expect(summary.removed == ["drop"])
        #expect(summary.unchanged == ["keep"])
    }

    @Test func aProviderWhoseKeyFileNowHoldsAnotherKeyIsChanged() throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write("key.pem", "first")
        let json = #"[{"name": "signed", "source": {"type": "jwt", "keyFile": "\#(path)"}}]"#
        let before = try providers(json)
        #expect(Broker.compare(old: before, new: try providers(json)).unchanged == ["signed"])
        try directory.write("key.pem", "second")
        let after = try providers(json)
        #expect(Broker.compare(old: before, new: after).changed == ["signed"])
    }

    @Test func changesOnlyARestartCanMakeAreNamed() throws {
        let old = try configuration(#"{"listen": "127.0.0.1:8080"}"#)
        #expect(Broker.restartNeeded(from: old, to: old) == nil)
        let moved = try configuration(
            #"{"listen": "127.0.0.1:8081", "connectionLimit": 100, "logFormat": "json", "maxWaitSec": 5}"#)
        #expect(
            Broker.restartNeeded(from: old, to: moved) == "changing listen, connectionLimit, logFormat needs a restart")
        let withProxy = try configuration(
            #"{"listen": "127.0.0.1:8080", "proxies": [{"name": "api", "target": "http://127.0.0.1:9/"}]}"#)
        #expect(Broker.restartNeeded(from: old, to: withProxy)?.contains("proxies") == true)
        // Routes, waits and the request guard change without a restart; so do the proxies once there is one.
        let routes = try configuration(
            #"{"listen": "127.0.0.1:8080", "maxWaitSec": 5, "requestGuard": false, "reloadTimeoutSec": 3}"#)
        #expect(Broker.restartNeeded(from: old, to: routes) == nil)
        let otherProxy = try configuration(
            #"{"listen": "127.0.0.1:8080", "proxies": [{"name": "web", "target": "http://127.0.0.1:10/"}]}"#)
        #expect(Broker.restartNeeded(from: withProxy, to: otherProxy) == nil)
    }

    @Test func onceTheBrokerStopsEachReloadAskedForIsAnsweredAtOnceAsAbandonedAndCounted() {
        // Only after `close`: before it, a request raises SIGHUP, which would end this process.
        let metrics = BrokerMetrics(version: "test")
        let requests = ReloadRequests(metrics: metrics)
        requests.close()
        #expect(metrics.render(statuses: []).contains(#"token_broker_reloads_total{result="abandoned"} 0"#))
        let answers = Lock<[String?]>([])
        for _ in 0..<2 {
            requests.request { outcome in answers.withLock { $0.append(outcome.problem) } }
        }
        #expect(answers.withLock { $0 } == ["the broker is stopping", "the broker is stopping"])
        #expect(metrics.render(statuses: []).contains(#"token_broker_reloads_total{result="abandoned"} 2"#))
        #expect(requests.take().isEmpty)
    }

    @Test func theCommandPrintsTheAnswerAsOneLineAndRefusesAnythingElse() {
        let body = #"{"reloaded":true,"added":["d"],"changed":["b","e"],"removed":[],"unchanged":["a"]}"#
        #expect(
            ReloadCommand.summary(Array(body.utf8))
                == "reloaded; added: d; changed: b, e; removed: -; unchanged: a")
        #expect(ReloadCommand.summary(Array(#"{"reloaded":true}"#.utf8)) == nil)
        #expect(ReloadCommand.summary(Array(#"{"status":"ok"}"#.utf8)) == nil)
        #expect(ReloadCommand.summary(Array("not json".utf8)) == nil)
        let hostile = #"{"reloaded":true,"added":["a\nb"],"changed":[],"removed":[],"unchanged":[]}"#
        #expect(ReloadCommand.summary(Array(hostile.utf8))?.contains("\n") == false)
    }

    @Test func reloadIsACommandOfItsOwn() throws {
        #expect(
            try Options.parse(["reload", "--address", "http://127.0.0.1:9090"])
                == .reload(arguments: ["--address", "http://127.0.0.1:9090"]))
        #expect(try ReloadCommand.parse(["--config", "c.json"]).configPath == "c.json")
        #expect(throws: Options.Problem.self) { try ReloadCommand.parse(["--provider", "a"]) }
    }

    @Test func reloadWaitsForTheTimeoutGivenElseTheConfigurationsReloadTimeoutAndAMinuteMore() throws {
        #expect(try ReloadCommand.parse(["--timeout", "5"]).timeoutSec == 5)
        #expect(try ReloadCommand.parse(["--timeout=660"]).timeoutSec == 660)
        for bad in ["0", "661", "x", "1.5", "-1"] {
            #expect(throws: Options.Problem.self) { try ReloadCommand.parse(["--timeout", bad]) }
        }
        let given = try ReloadCommand.parse(["--address", "http://127.0.0.1:9090", "--timeout", "7"])
        #expect(ReloadCommand.timeoutSec(given, environment: [:]) == 7)
        // With --address, no configuration is read: the longest reload, and a minute more.
        #expect(
            ReloadCommand.timeoutSec(try ReloadCommand.parse(["--address", "http://a:1"]), environment: [:]) == 660)
        // The configuration's listener: its reloadTimeoutSec (default 30), and a minute more.
        #expect(ReloadCommand.timeoutSec(try ReloadCommand.parse([]), environment: [:]) == 90)
        let directory = try TemporaryDirectory()
        let path = try directory.write("c.json", #"{"reloadTimeoutSec": 200}"#)
        #expect(ReloadCommand.timeoutSec(try ReloadCommand.parse(["--config", path]), environment: [:]) == 260)
        #expect(
            ReloadCommand.timeoutSec(try ReloadCommand.parse([]), environment: ["TOKEN_BROKER_CONFIG": path]) == 260)
    }
}
