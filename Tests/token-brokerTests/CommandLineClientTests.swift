import Testing
import TokenBrokerCore
import TokenBrokerUpstream

@testable import token_broker

@Suite struct CommandLineClientTests {
    private typealias Failure = CommandLineClient.Failure

    // MARK: Arguments

    @Test func tokenReadsEveryFlagInBothSpellings() throws {
        #expect(try TokenCommand.parse([]) == TokenCommand.Arguments())
        let parsed = try TokenCommand.parse([
            "--provider", "apis", "--audience=https://a.example", "--scope", "read write", "--resource=r",
            "--key-file", "/k", "--config=c.json", "--address", "unix:/s", "--timeout", "30",
        ])
        #expect(
            parsed
                == TokenCommand.Arguments(
                    configPath: "c.json", address: "unix:/s", provider: "apis", audience: "https://a.example",
                    scope: "read write", resource: "r", keyFile: "/k", timeoutSec: 30))
        #expect(try TokenCommand.parse(["--audience=a=b"]).audience == "a=b")
        #expect(try TokenCommand.parse(["--provider", "x", "--help"]).help)
        #expect(try StatusCommand.parse(["-h"]).help)
        #expect(
            try StatusCommand.parse(["--config", "c.json", "--address=http://a:1"])
                == StatusCommand.Arguments(configPath: "c.json", address: "http://a:1"))
    }

    @Test(arguments: [
        (["--provider"], "--provider needs a value"),
        (["--provider="], "--provider needs a value"),
        (["--scope", "a", "--scope=b"], "--scope is given twice"),
        (["--timeout", "0"], "--timeout \"0\" is not whole seconds 1-120"),
        (["--timeout", "121"], "--timeout \"121\" is not whole seconds 1-120"),
        (["--timeout", "1e3"], "--timeout \"1e3\" is not whole seconds 1-120"),
        (["apis"], "unknown argument \"apis\"; \(TokenCommand.usage)"),
        (["--key"], "unknown argument \"--key\"; \(TokenCommand.usage)"),
        (["-provider", "x"], "unknown argument \"-provider\"; \(TokenCommand.usage)"),
        (["--Provider=x"], "unknown argument \"--Provider=x\"; \(TokenCommand.usage)"),
    ])
    func badTokenArgumentsAreNamed(_ arguments: [String], _ problem: String) {
        #expect(throws: Options.Problem(description: problem)) { try TokenCommand.parse(arguments) }
    }

    @Test func statusTakesNoTokenFlags() {
        #expect(throws: Options.Problem(description: "unknown argument \"--provider\"; \(StatusCommand.usage)")) {
            try StatusCommand.parse(["--provider", "x"])
        }
    }

    @Test func bothCommandsTakeTheRestOfTheCommandLineOnlyWhenTheyComeFirst() throws {
        #expect(try Options.parse(["token", "--provider", "a"]) == .token(arguments: ["--provider", "a"]))
        #expect(try Options.parse(["status"]) == .status(arguments: []))
        #expect(throws: Options.Problem(description: "unknown argument \"token\"")) {
            try Options.parse(["--check-config", "token"])
        }
    }

    @Test func badCommandLinesExitWith2BeforeAskingAnything() {
        #expect(Options.run(arguments: ["token", "--bogus"]) == 2)
        #expect(Options.run(arguments: ["status", "--config"]) == 2)
        #expect(TokenCommand.run(arguments: ["--address", "ftp://127.0.0.1:1"], environment: [:]) == 2)
        #expect(StatusCommand.run(arguments: [], environment: ["TOKEN_BROKER_ADMIN_LISTEN": "nowhere"]) == 2)
    }

    // MARK: The request

    @Test func theRouteNamesTheProviderAndEncodesEachValueWhole() {
        #expect(TokenCommand.path(TokenCommand.Arguments()) == "/token")
        #expect(TokenCommand.path(TokenCommand.Arguments(provider: "apis")) == "/providers/apis/token")
        #expect(
            TokenCommand.path(
                TokenCommand.Arguments(
                    provider: "a/../b?c", audience: "https://x.example/p?q=1&scope=admin#f", scope: "read write",
                    resource: "é~-._"))
                == "/providers/a%2F..%2Fb%3Fc/token?audience=https%3A%2F%2Fx.example%2Fp%3Fq%3D1%26scope%3Dadmin%23f"
                + "&scope=read%20write&resource=%C3%A9~-._")
        #expect(TokenCommand.path(TokenCommand.Arguments(scope: "+%\u{0}")) == "/token?scope=%2B%25%00")
    }

    @Test func theListenerIsTheConfigurationsWithTheEnvironmentOverIt() throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write(
            "c.json", #"{"listen": "0.0.0.0:8181", "adminListen": "unix:/run/tb/admin.sock"}"#)
        let environment = ["TOKEN_BROKER_CONFIG": file]
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: nil, listener: .token, path: "/token", environment: environment)
                == .init(target: .init(url: "http://127.0.0.1:8181/token"), shown: "http://127.0.0.1:8181"))
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: nil, listener: .admin, path: "/readyz", environment: environment)
                == .init(
                    target: .init(url: "http://localhost/readyz", unixSocketPath: "/run/tb/admin.sock"),
                    shown: "unix:/run/tb/admin.sock"))
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: nil, listener: .token, path: "/token",
                environment: environment.merging(["TOKEN_BROKER_LISTEN": "[::]:7000"]) { $1 })
                == .init(target: .init(url: "http://[::1]:7000/token"), shown: "http://[::1]:7000"))
        // An address given wins, and the configuration is not read at all.
        #expect(
            try CommandLineClient.endpoint(
                address: "http://10.0.0.1:80/", configPath: directory.path("missing.json"), listener: .token,
                path: "/token", environment: [:])
                == .init(target: .init(url: "http://10.0.0.1:80/token"), shown: "http://10.0.0.1:80"))
    }

    @Test func ofTheFileOnlyTheListenerAskedIsRead() throws {
        let directory = try TemporaryDirectory()
        // A file the broker would refuse (a typo saved since it started) still finds it.
        let typo = try directory.write(
            "typo.json",
            #"{"listen": "127.0.0.1:8181", "adminListen": "127.0.0.1:9191", "#
                + #""providers": [{"name": "a"}, {"name": "new", "tokenRefreshDelaySec": 0}], "maxRetryCont": 1}"#)
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: typo, listener: .token, path: "/token", environment: [:]
            ).shown
                == "http://127.0.0.1:8181")
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: typo, listener: .admin, path: "/readyz", environment: [:]
            ).shown
                == "http://127.0.0.1:9191")
        // The other listener's key is not read either.
        let badAdmin = try directory.write("admin.json", #"{"listen": "127.0.0.1:8181", "adminListen": 9191}"#)
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: badAdmin, listener: .token, path: "/token", environment: [:]
            ).shown
                == "http://127.0.0.1:8181")
        #expect(
            throws: Failure(
                .usage, "invalid configuration: adminListen: must be a string, not a number (in \(badAdmin))")
        ) {
            try CommandLineClient.endpoint(
                address: nil, configPath: badAdmin, listener: .admin, path: "/readyz", environment: [:])
        }
        // With the environment's variable, the file is not read at all.
        let notJSON = try directory.write("broken.json", #"{"listen": "127.0.0.1:8181","#)
        #expect(
            try CommandLineClient.endpoint(
                address: nil, configPath: notJSON, listener: .admin, path: "/readyz",
                environment: ["TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:7070"]
            ).shown == "http://127.0.0.1:7070")
    }

    @Test(arguments: [
        (#"{"listen": "127.0.0.1:8181","#, "the file is not valid JSON"),
        (#"["127.0.0.1:8181"]"#, "must be an object, not an array"),
        (#"{"listen": "localhost:8181"}"#, "listen: \"localhost:8181\" is not a listen address"),
        (#"{"listen": ["127.0.0.1:8181"]}"#, "listen: must be a string, not an array"),
    ])
    func aFileWhoseListenerCannotBeReadIsAConfigurationError(_ json: String, _ problem: String) throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write("c.json", json)
        #expect {
            try CommandLineClient.endpoint(
                address: nil, configPath: file, listener: .token, path: "/token", environment: [:])
        } throws: { error in
            guard let failure = error as? Failure else { return false }
            return failure.exit == .usage && failure.reason.hasPrefix("invalid configuration: \(problem)")
                && failure.reason.contains(file)
        }
    }

    @Test func reloadWaitsForTheFilesReloadTimeoutWhateverElseTheFileHolds() throws {
        let directory = try TemporaryDirectory()
        let reload = try ReloadCommand.parse(["--config", directory.path("c.json")])
        try directory.write("c.json", #"{"reloadTimeoutSec": 200, "providers": [{"maxRetryCount": 11}]}"#)
        #expect(ReloadCommand.timeoutSec(reload, environment: [:]) == 260)
        try directory.write("c.json", #"{"providers": [{"maxRetryCount": 11}]}"#)
        #expect(ReloadCommand.timeoutSec(reload, environment: [:]) == 90)
        // No value it can trust: long enough for any reload.
        for json in [#"{"reloadTimeoutSec": 0}"#, #"{"reloadTimeoutSec": "30"}"#, "{", "[]"] {
            try directory.write("c.json", json)
            #expect(ReloadCommand.timeoutSec(reload, environment: [:]) == 660, "\(json)")
        }
        #expect(
            ReloadCommand.timeoutSec(
                try ReloadCommand.parse(["--config", directory.path("missing.json")]), environment: [:]) == 660)
    }

    @Test(arguments: [
        ("http://127.0.0.1:8080/token", "--address \"http://127.0.0.1:8080/token\" is neither"),
        ("127.0.0.1:8080", "--address \"127.0.0.1:8080\" is neither"),
        ("unix:relative.sock", "--address \"unix:relative.sock\" is neither"),
        ("http://127.0.0.1:8080?x", "--address \"http://127.0.0.1:8080?x\" is neither"),
        ("http://127.0.0.1:8080#x", "--address \"http://127.0.0.1:8080#x\" is neither"),
    ])
    func anAddressWithAPathOrWithoutASchemeIsAUsageError(_ address: String, _ start: String) {
        #expect {
            try CommandLineClient.endpoint(
                address: address, configPath: nil, listener: .token, path: "/token", environment: [:])
        } throws: { error in
            guard let failure = error as? Failure else { return false }
            return failure.exit == .usage && failure.reason.hasPrefix(start)
        }
    }

    @Test func aListenerOnPort0CannotBeFound() {
        #expect(
            throws: Failure(.usage, "the admin listener 127.0.0.1:0 has port 0 (picked at start); give --address")
        ) {
            try CommandLineClient.endpoint(
                address: nil, configPath: nil, listener: .admin, path: "/readyz",
                environment: ["TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"])
        }
    }

    @Test func theSharedTargetFinderAsksAnyPathOnLoopback() throws {
        #expect(
            HealthCheck.target(listen: try ListenAddress(parsing: "0.0.0.0:8080"), path: "/token")
                == HealthCheck.Target(url: "http://127.0.0.1:8080/token"))
        #expect(HealthCheck.target(listen: try ListenAddress(parsing: "127.0.0.1:0"), path: "/token") == nil)
        #expect(HealthCheck.origin(given: "http://a:1/x/y")?.path == "/x/y")
        #expect(HealthCheck.origin(given: "http://a:1")?.origin == HealthCheck.Target(url: "http://a:1"))
        #expect(HealthCheck.origin(given: "http:///x") == nil)
    }

    // MARK: The caller key

    @Test func theCallerKeyComesFromTheFileGivenElseTheEnvironmentWithoutItsLineBreak() throws {
        let directory = try TemporaryDirectory()
        let first = try directory.write("first", "k3y-one\r\n")
        let second = try directory.write("second", "k3y-two")
        #expect(try TokenCommand.callerKey(file: nil, environment: [:]) == nil)
        #expect(try TokenCommand.callerKey(file: nil, environment: ["TOKEN_BROKER_CALLER_KEY_FILE": ""]) == nil)
        #expect(try TokenCommand.callerKey(file: first, environment: [:]) == "k3y-one")
        #expect(
            try TokenCommand.callerKey(file: nil, environment: ["TOKEN_BROKER_CALLER_KEY_FILE": second]) == "k3y-two")
        #expect(
            try TokenCommand.callerKey(file: first, environment: ["TOKEN_BROKER_CALLER_KEY_FILE": second]) == "k3y-one")
    }

    @Test(arguments: ["secret one\n", "secret\ttab", "two\nlines\n", "", "\n", "sécret"])
    func aKeyFileThatIsNotOneVisibleASCIIKeyIsAUsageErrorThatNeverShowsIt(_ contents: String) throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write("key", contents)
        #expect {
            try TokenCommand.callerKey(file: file, environment: [:])
        } throws: { error in
            guard let failure = error as? Failure else { return false }
            return failure.exit == .usage && failure.reason.contains(file) && !failure.reason.contains("secret")
                && !failure.reason.contains("sécret")
        }
    }

    @Test func aMissingKeyFileIsNamedWithWhereItsNameCameFrom() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.path("missing")
        #expect(
            throws: Failure(
                .usage, "caller key (TOKEN_BROKER_CALLER_KEY_FILE): cannot read \(missing): No such file or directory")
        ) {
            try TokenCommand.callerKey(file: nil, environment: ["TOKEN_BROKER_CALLER_KEY_FILE": missing])
        }
    }

    // MARK: The answer

    /// An answer as the broker gives it: `application/json` unless told.
    private func answer(_ status: Int, _ body: String, type: String? = "application/json") -> UpstreamResponse {
        UpstreamResponse(status: status, headers: type.map { ["content-type": $0] } ?? [:], body: Array(body.utf8))
    }

    @Test func aTokenAnswerGivesItsAccessTokenAlone() throws {
        let body = #"{"access_token":"abc.def","token_type":"Bearer","expires_in":5,"version":1}"#
        #expect(try TokenCommand.token(answer(200, body), shown: "x").get() == "abc.def")
        #expect(
            try TokenCommand.token(answer(200, body, type: "Application/JSON; charset=utf-8"), shown: "x").get()
                == "abc.def")
    }

    @Test(arguments: [
        #"{"token_type":"Bearer"}"#, #"{"access_token":""}"#, #"{"access_token":"a b"}"#,
        #"{"access_token":"a\u001b[31m"}"#, #"{"access_token":7}"#,
    ])
    func aSuccessWithoutAServableTokenIsNotTheBrokersAnswerAndNothingIsPrinted(_ body: String) {
        let result = TokenCommand.token(answer(200, body), shown: "http://h:1")
        #expect(
            result.failure
                == Failure(
                    .unexpectedAnswer,
                    "http://h:1 answered 200 without a token answer; is it the broker's token listener?"))
    }

    @Test(arguments: [
        (
            503, #"{"error":"token_unavailable","error_description":"provider \"d\" has no valid token"}"#,
            CommandLineClient.Exit.noValidToken,
            "no valid token: HTTP 503 token_unavailable: provider \"d\" has no valid token"
        ),
        (
            400, #"{"error":"value_not_allowed","error_description":"no","parameter":"scope"}"#, .refused,
            "refused: HTTP 400 value_not_allowed: no (parameter scope)"
        ),
        (
            401, #"{"error":"missing_caller_key","error_description":""}"#, .refused,
            "refused: HTTP 401 missing_caller_key; give the caller key with --key-file or TOKEN_BROKER_CALLER_KEY_FILE"
        ),
        (500, #"{"error":"x"}"#, .unexpectedAnswer, "unexpected answer from http://h:1: HTTP 500 x"),
        (302, "{}", .unexpectedAnswer, "unexpected answer from http://h:1: HTTP 302"),
    ])
    func eachFailureHasItsStatus(_ status: Int, _ body: String, _ exit: CommandLineClient.Exit, _ reason: String) {
        #expect(TokenCommand.token(answer(status, body), shown: "http://h:1").failure == Failure(exit, reason))
    }

    @Test(
        arguments: [
            (200, #"{"access_token":"abc.def"}"#, "text/html", "Content-Type text/html"),
            (200, "[]", "application/json", "a body that is not a JSON object"),
            (200, "", nil, "no Content-Type"),
            (404, "<html>not found</html>", "text/html", "Content-Type text/html"),
            (503, "Service Unavailable", "text/plain", "Content-Type text/plain"),
            (503, "<html>", "application/json", "a body that is not a JSON object"),
            (401, #"{"message":"no"}"#, "application/json", "a body without the broker's fields"),
            (500, "", nil, "no Content-Type"),
        ] as [(Int, String, String?, String)])
    func anAnswerThatIsNotTheBrokersExits1WhateverItsStatus(
        _ status: Int, _ body: String, _ type: String?, _ what: String
    ) {
        #expect(
            TokenCommand.token(answer(status, body, type: type), shown: "http://h:1").failure
                == Failure(
                    .unexpectedAnswer,
                    "http://h:1 gave an answer that is not the broker's (HTTP \(status), \(what)); is it the broker's token listener?"
                ))
    }

    @Test func libmicrohttpdsOwnRefusalOfARequestTooLargeIsARefusal() {
        // What the broker's HTTP server answers by itself for a URI past its buffer: no Content-Type.
        let html = "<html><head><title>Request too big</title></head><body>Your HTTP header was too big</body></html>"
        for status in [414, 431] {
            #expect(
                TokenCommand.token(answer(status, html, type: nil), shown: "http://h:1").failure
                    == Failure(.refused, "refused: HTTP \(status): the request is too large for the broker"))
        }
    }

    @Test func aNonHTTPAnswerIsNotTheBrokersAndNoConnectionIsUnreachable() {
        #expect(UpstreamError.timeout("Timeout was reached").isNoAnswer)
        #expect(UpstreamError.unreachable("Couldn't connect to server").isNoAnswer)
        #expect(UpstreamError.unreachable("Server returned nothing (no headers, no data)").isNoAnswer)
        for detail in ["Unsupported protocol", "Transferred a partial file", "Out of memory", "Weird server reply"] {
            #expect(!UpstreamError.unreachable(detail).isNoAnswer, "\(detail)")
        }
    }

    @Test func theExitStatusesAreTheDocumentedOnes() {
        #expect(
            ([.ok, .unexpectedAnswer, .usage, .unreachable, .noValidToken, .refused] as [CommandLineClient.Exit])
                .map(\.rawValue)
                == [0, 1, 2, 3, 4, 5] as [Int32])
        for line in [
            "3  the broker is unreachable", "4  token: the broker has no valid token", "5  token: the broker refused",
        ] {
            #expect(Options.help.contains(line))
        }
    }

    // MARK: Output

    @Test func aReasonIsOneLineWithoutTheSecrets() {
        #expect(CommandLineClient.oneLine("a\nb\r\u{1b}[31mc\u{85}d\u{2028}e\u{7f}") == "a b  [31mc d e ")
        #expect(
            CommandLineClient.oneLine("key k3y and k3yk3y", hiding: ["k3y", ""]) == "key [hidden] and [hidden][hidden]")
        #expect(CommandLineClient.oneLine("a [hidden] d", hiding: ["d", "hidden"]) == "a [[hidden]] [hidden]")
        #expect(CommandLineClient.oneLine(String(repeating: "x", count: 500)).count == CommandLineClient.reasonLimit)
        #expect(CommandLineClient.oneLine("abcdef", limit: 4) == "abc…")
    }

    @Test func aServersTextIsPrintedAsPrintableASCIIAndTheKeyHiddenHoweverItIsDressed() {
        let key = "k-0123abcdEF"
        for dressed in [
            "k-0123\u{200B}abcdEF", "k-0123\u{0}abcdEF", "k-0123abcd\u{1b}EF", "K-0123ABCDEF", "k-0123 abcdEF",
            "k\u{301}\u{301}-0123abcdef", "k-\u{2066}0123abcd\u{2069}EF",
        ] {
            #expect(
                CommandLineClient.oneLine("HTTP 401 x: key " + dressed + " refused", hiding: [key])
                    == "HTTP 401 x: key [hidden] refused", "\(Array(dressed.unicodeScalars))")
        }
        // Format characters (bidirectional overrides and isolates, zero-width ones) and combining
        // marks never reach the terminal: each is a "?".
        #expect(
            CommandLineClient.oneLine("a\u{202E}b\u{2066}c\u{200B}d\u{FEFF}e" + String(repeating: "\u{301}", count: 3))
                == "a?b?c?d?e???")
        #expect(CommandLineClient.oneLine("caf\u{E9} \u{1F600}") == "caf? ?")
        #expect(
            CommandLineClient.oneLine(String(repeating: "\u{301}", count: 500)).unicodeScalars.count
                == CommandLineClient.reasonLimit)
    }

    @Test(
        arguments: [
            (0, "0s"), (59, "59s"), (60, "1m0s"), (252, "4m12s"), (3600, "1h0m0s"), (7325, "2h2m5s"),
            (86_400, "1d0h0m0s"), (31_536_000, "365d0h0m0s"), (-1, "expired"), (Int64.max, "106751991167300d15h30m7s"),
        ] as [(Int64, String)])
    func durationsReadAsPeopleWriteThem(_ seconds: Int64, _ text: String) {
        #expect(CommandLineClient.duration(seconds: seconds) == text)
    }

    @Test func theTableIsFixedWidthWithoutTrailingSpaces() {
        #expect(
            CommandLineClient.table([["A", "BB", "C"], ["long", "x", "last cell"], ["y", "", "z"]])
                == "A     BB  C\nlong  x   last cell\ny         z\n")
        #expect(CommandLineClient.table([]) == "")
    }

    @Test func statusTablesFromReadyz() {
        let body = """
            {"ready":false,"providers":[
              {"name":"default","ready":true,"state":"fresh","stale":false,"version":3,"expires_in":252},
              {"name":"down","ready":false,"state":"backing_off","stale":false,"last_error":"unreachable",
               "last_error_description":"unreachable: Couldn't connect\\nto server"},
              {"name":"old","ready":true,"state":"backing_off","stale":true,"version":1e300,"expires_in":-1e300,
               "last_error":"timeout"}],
             "templates":[{"name":"apis","children":2,"ready":1,"max_children":100}],"sinks":[]}
            """
        #expect(
            StatusCommand.tables(Array(body.utf8))
                == """
                NAME     STATE        VERSION  EXPIRES IN  STALE  LAST ERROR
                default  fresh        3        4m12s       no     -
                down     backing_off  -        -           no     unreachable: Couldn't connect to server
                old      backing_off  -        -           yes    timeout

                TEMPLATE  CHILDREN  READY  MAX
                apis      2         1      100

                """)
    }

    @Test func statusWithoutTemplatesIsOneTable() {
        #expect(
            StatusCommand.tables(Array(#"{"providers":[],"templates":[]}"#.utf8))
                == "NAME  STATE  VERSION  EXPIRES IN  STALE  LAST ERROR\n")
    }

    @Test(arguments: [
        "", "[]", #"{"status":"ok"}"#, #"{"providers":{}}"#, #"{"providers":[1]}"#, #"{"providers":[{"state":"x"}]}"#,
        #"{"providers":[],"templates":[{"children":1}]}"#,
    ])
    func anythingButReadyzIsNoTable(_ body: String) {
        #expect(StatusCommand.tables(Array(body.utf8)) == nil)
    }
}
