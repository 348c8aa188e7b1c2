import Testing
import TokenBrokerCore

@testable import token_broker

@Suite struct OptionsTests {
    @Test func noArgumentsRunTheBrokerOnTheEmbeddedDefault() throws {
        #expect(try Options.parse([]) == .broker(configPath: nil, checkOnly: false))
    }

    @Test func theConfigFileIsReadInBothSpellingsAndTheLastOneWins() throws {
        #expect(try Options.parse(["--config", "a.json"]) == .broker(configPath: "a.json", checkOnly: false))
        #expect(
            try Options.parse(["--config=b.json", "--check-config"]) == .broker(configPath: "b.json", checkOnly: true))
        #expect(
            try Options.parse(["--config", "a.json", "--config=b.json"])
                == .broker(configPath: "b.json", checkOnly: false))
        #expect(try Options.parse(["--config="]) == .broker(configPath: "", checkOnly: false))
    }

    @Test func helpAndVersionWinUnlessABadArgumentComesFirst() throws {
        #expect(try Options.parse(["--help"]) == .help)
        #expect(try Options.parse(["-h", "--frobnicate"]) == .help)
        #expect(try Options.parse(["--check-config", "--version", "--help"]) == .version)
        #expect(throws: Options.Problem(description: "unknown argument \"--frobnicate\"")) {
            try Options.parse(["--frobnicate", "--help"])
        }
    }

    @Test func healthcheckTakesTheRestOfTheArgumentsOnlyWhenItComesFirst() throws {
        #expect(
            try Options.parse(["healthcheck", "--config", "x", "unix:/s"])
                == .healthCheck(arguments: ["--config", "x", "unix:/s"]))
        #expect(try Options.parse(["healthcheck"]) == .healthCheck(arguments: []))
        #expect(throws: Options.Problem(description: "unknown argument \"healthcheck\"")) {
            try Options.parse(["--check-config", "healthcheck"])
        }
    }

    @Test(arguments: [
        (["--config"], "--config needs a file"),
        (["--check-config", "--config"], "--config needs a file"),
        (["run"], "unknown argument \"run\""),
        (["--config", "a.json", "extra"], "unknown argument \"extra\""),
        (["-c", "a.json"], "unknown argument \"-c\""),
        (["--Config=a.json"], "unknown argument \"--Config=a.json\""),
    ])
    func badArgumentsAreNamed(_ arguments: [String], _ problem: String) {
        #expect(throws: Options.Problem(description: problem)) { try Options.parse(arguments) }
    }

    @Test func badCommandLinesExitWith2() {
        #expect(Options.run(arguments: ["--frobnicate"]) == 2)
        #expect(Options.run(arguments: ["--check-config", "--config"]) == 2)
    }

    @Test func checkConfigExits0ForAGoodFileAnd2ForABadOrMissingOne() throws {
        let directory = try TemporaryDirectory()
        let good = try directory.write("good.json", #"{"providers": [{"name": "a"}]}"#)
        let bad = try directory.write("bad.json", #"{"providers": [{"maxRetryCount": 11}]}"#)
        #expect(Options.run(arguments: ["--check-config", "--config", good]) == 0)
        #expect(Options.run(arguments: ["--check-config", "--config=\(bad)"]) == 2)
        #expect(Options.run(arguments: ["--check-config", "--config", directory.path("missing.json")]) == 2)
    }

    @Test func theFileGivenWinsOverTheEnvironmentWhichMustNotBeEmpty() throws {
        #expect(
            try Options.configurationPath(given: "a.json", environment: ["TOKEN_BROKER_CONFIG": "b.json"]) == "a.json")
        #expect(try Options.configurationPath(given: nil, environment: ["TOKEN_BROKER_CONFIG": "b.json"]) == "b.json")
        #expect(try Options.configurationPath(given: "a.json", environment: ["TOKEN_BROKER_CONFIG": ""]) == "a.json")
        #expect(try Options.configurationPath(given: nil, environment: [:]) == nil)
        // Set but empty (a template's variable left unfilled) is not the embedded default.
        #expect(
            throws: ConfigurationError(
                key: "TOKEN_BROKER_CONFIG",
                "is set but empty; unset it for the embedded default configuration, or give a value")
        ) {
            try Options.configurationPath(given: nil, environment: ["TOKEN_BROKER_CONFIG": ""])
        }
    }

    @Test func loadNamesAFileItCannotReadAndTheFileOfAKeyItRefuses() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.path("missing.json")
        #expect(throws: ConfigurationError.self) { try Options.load(path: missing, environment: [:]) }
        do {
            _ = try Options.load(path: missing, environment: [:])
        } catch {
            #expect(error.key == "")
            #expect(error.message.hasPrefix("cannot read configuration file \(missing): "))
        }
        let bad = try directory.write("bad.json", #"{"providers": [{"maxRetryCount": 11}]}"#)
        do {
            _ = try Options.load(path: bad, environment: [:])
            Issue.record("a maxRetryCount of 11 was accepted")
        } catch {
            #expect(error.key == "providers[0].maxRetryCount")
            #expect(error.message.hasSuffix("(in \(bad))"))
        }
    }

    @Test func loadReadsRelativePathsFromTheFilesDirectoryAndAppliesTheEnvironmentOverIt() throws {
        let directory = try TemporaryDirectory()
        let path = try directory.write(
            "config.json",
            #"{"listen": "127.0.0.1:1", "providers": [{"source": {"keyFile": "keys/key.pem"}}]}"#)
        let loaded = try Options.load(path: path, environment: ["TOKEN_BROKER_LISTEN": "127.0.0.1:7000"])
        #expect(loaded.listen.description == "127.0.0.1:7000")
        guard case .jwt(let settings) = loaded.providers[0].source else {
            Issue.record("the source is not the local signer")
            return
        }
        #expect(settings.keyFile == directory.path("keys/key.pem"))
        #expect(throws: ConfigurationError.self) {
            try Options.load(path: path, environment: ["TOKEN_BROKER_LISTEN": "nowhere"])
        }
    }

    @Test func withoutAFileTheEmbeddedDefaultIsLoaded() throws {
        let loaded = try Options.load(path: nil, environment: [:])
        #expect(loaded.providers.map(\.name) == ["default"])
        #expect(loaded.listen.description == "127.0.0.1:8080")
        #expect(loaded.adminListen.description == "127.0.0.1:9090")
    }
}
