import Testing
import TokenBrokerCore

@Suite struct ConfigurationTests {
    private func parse(_ json: String) throws(ConfigurationError) -> BrokerConfiguration {
        try BrokerConfiguration(json: Array(json.utf8))
    }

    @Test func anEmptyDocumentGivesTheEmbeddedDefault() throws {
        let configuration = try parse("{}")
        #expect(configuration.listen.description == "127.0.0.1:8080")
        #expect(configuration.adminListen.description == "127.0.0.1:9090")
        #expect(configuration.providers.map(\.name) == ["default"])
        #expect(configuration.providers[0].source == .jwt(JWTSourceConfiguration(algorithm: .es256, lifetimeSec: 900)))
        #expect(configuration.providers[0].tokenRefreshDelaySec == 300)
        #expect(configuration.providers[0].maxErrorTokenRefreshDelayMsec == 5000)
    }

    @Test func theIssuesExampleIsAccepted() throws {
        let configuration = try parse(
            """
            {"listen": "127.0.0.1:8080", "adminListen": "127.0.0.1:9090",
             "providers": [{"name": "default",
               "source": {"type": "jwt", "algorithm": "RS256", "issuer": "token-broker", "audience": "api", "lifetimeSec": 900},
               "backgroundRefreshEnabled": true, "tokenRefreshDelaySec": 300, "maxRetryCount": 5,
               "maxErrorTokenRefreshDelayMsec": 5000}]}
            """)
        guard case .jwt(let jwt) = configuration.providers[0].source else { return }
        #expect(jwt.audience == "api")
        #expect(jwt.algorithm == .rs256)
    }

    @Test func unknownKeysAreErrorsThatNameTheKeyAndTheAllowedOnes() {
        let message = configurationProblem(#"{"providers": [{"name": "a", "maxRetryCont": 3}]}"#)
        #expect(message?.hasPrefix("providers[0].maxRetryCont: unknown key; allowed: name, source,") == true)
        #expect(configurationProblem(#"{"lisen": "127.0.0.1:1"}"#)?.hasPrefix("lisen: unknown key") == true)
        #expect(
            configurationProblem(#"{"providers": [{"source": {"type": "jwt", "alg": "ES256"}}]}"#)?.hasPrefix(
                "providers[0].source.alg: unknown key") == true)
    }

    /// A `null` value is an error naming its key, wherever it stands, as an unknown key is: it
    /// was taken as "not set", so that `"clientKeysFile": null` turned the caller keys off,
    /// `"providers": null` ran the default signer and `"store": null` the memory store, and
    /// `--check-config` said the file was fine.
    @Test(arguments: [
        (#"{"clientKeysFile": null}"#, "clientKeysFile"),
        (#"{"providers": null}"#, "providers"),
        (#"{"store": null}"#, "store"),
        (#"{"listen": null}"#, "listen"),
        (#"{"requestGuard": null}"#, "requestGuard"),
        (#"{"maxWaitSec": null}"#, "maxWaitSec"),
        (#"{"compat": null}"#, "compat"),
        (#"{"providers": [{"name": null}]}"#, "providers[0].name"),
        (#"{"providers": [{"source": null}]}"#, "providers[0].source"),
        (#"{"providers": [{"source": {"type": "jwt", "keyFile": null}}]}"#, "providers[0].source.keyFile"),
        (
            #"{"providers": [{"source": {"type": "http", "url": "https://i.example/", "headers": {"X-Key": null}}}]}"#,
            "providers[0].source.headers.X-Key"
        ),
        (
            #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/", "clientID": "c", "#
                + #""clientSecret": "s", "extraParams": {"prompt": null}}}]}"#,
            "providers[0].source.extraParams.prompt"
        ),
        (
            #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/", "clientID": "c", "#
                + #""clientSecret": "s", "resource": null}}]}"#,
            "providers[0].source.resource"
        ),
        (
            #"{"proxies": [{"name": "w", "target": "http://127.0.0.1:10/", "timeoutMsec": null}]}"#,
            "proxies[0].timeoutMsec"
        ),
    ])
    func aNullValueIsAnErrorNamingItsKey(json: String, key: String) {
        #expect(configurationProblem(json) == "\(key): is null; leave the key out for its default, or give a value")
    }

    @Test func aProxysUnknownKeyListsEachAllowedKeyOnceAndNotTheOneItRefuses() throws {
        let message = try #require(
            configurationProblem(#"{"proxies": [{"name": "w", "target": "http://127.0.0.1:10/", "bogus": 1}]}"#))
        let allowed = message.split(separator: ";")[1].dropFirst(" allowed: ".count).split(separator: " (")[0]
            .split(separator: ", ").map(String.init)
        #expect(message.hasPrefix("proxies[0].bogus: unknown key; allowed: name, target,"), "\(message)")
        #expect(Set(allowed).count == allowed.count, "\(allowed)")
        #expect(allowed.contains("timeoutMsec") && !allowed.contains("maxResponseBytes"), "\(allowed)")
        #expect(
            configurationProblem(
                #"{"proxies": [{"name": "w", "target": "http://127.0.0.1:10/", "maxResponseBytes": 1}]}"#)?
                .hasPrefix("proxies[0].maxResponseBytes: does not apply to proxies") == true)
    }

    @Test func aNumberTooSmallForADoubleIsRefusedNotReadAsZero() {
        // 1e-400 would read as 0: a whole-number setting would take it while it refuses 30.5.
        for written in ["1e-400", "-1e-400", "0.5e-330", "1E-9999"] {
            #expect(
                configurationProblem(#"{"providers": [{"maxRetryCount": "# + written + "}]}")?.contains(
                    "a number is out of range") == true, "\(written)")
        }
        #expect(
            configurationProblem(#"{"providers": [{"maxRetryCount": 30.5}]}"#)?.hasPrefix(
                "providers[0].maxRetryCount: must be a whole number") == true)
        #expect(configurationProblem(#"{"providers": [{"maxRetryCount": 0e-400}]}"#) == nil)
        #expect(configurationProblem(#"{"providers": [{"maxRetryCount": 0.000}]}"#) == nil)
    }

    @Test func valuesOutOfRangeNameTheKeyAndTheRange() {
        #expect(
            configurationProblem(#"{"providers": [{"maxRetryCount": 11}]}"#)
                == "providers[0].maxRetryCount: 11 is out of range; allowed: 0–10")
        #expect(
            configurationProblem(#"{"providers": [{"tokenRefreshDelaySec": 0}]}"#)
                == "providers[0].tokenRefreshDelaySec: 0 is out of range; allowed: 1–86400")
        #expect(
            configurationProblem(#"{"providers": [{"maxErrorTokenRefreshDelayMsec": 30001}]}"#)
                == "providers[0].maxErrorTokenRefreshDelayMsec: 30001 is out of range; allowed: 1–30000")
        #expect(
            configurationProblem(#"{"providers": [{"maxRetryCount": 2.5}]}"#)?.hasPrefix(
                "providers[0].maxRetryCount: must be a whole number in 0–10") == true)
        #expect(
            configurationProblem(#"{"providers": [{"source": {"algorithm": "none"}}]}"#)
                == #"providers[0].source.algorithm: unknown value "none"; allowed: ES256, RS256, HS256"#)
        #expect(
            configurationProblem(
                #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/t", "clientID": "c", "clientSecret": "s", "clientAuth": "tls_client_auth"}}]}"#
            )
                == #"providers[0].source.clientAuth: unknown value "tls_client_auth"; allowed: client_secret_basic, client_secret_post, private_key_jwt"#
        )
        #expect(
            configurationProblem(
                #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/t", "clientID": "c", "clientAuth": "client_secret_post"}}]}"#
            )
                == #"providers[0].source.clientSecretFile: give exactly one of clientSecret and clientSecretFile with clientAuth "client_secret_post""#
        )
        #expect(
            configurationProblem(
                #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/t", "clientID": "c", "clientAuth": "private_key_jwt"}}]}"#
            ) == #"providers[0].source.privateKeyFile: is required with clientAuth "private_key_jwt""#)
        #expect(
            configurationProblem(#"{"providers": [{"source": {"algorithm": "HS256"}}]}"#)?.hasPrefix(
                "providers[0].source.keyFile: is required with HS256") == true)
        #expect(
            configurationProblem(#"{"providers": [{"source": {"type": "magic"}}]}"#)
                == #"providers[0].source.type: unknown value "magic"; allowed: jwt, oauth2, http, file"#)
    }

    // MARK: - oauth2: nothing sent twice, nothing taken and ignored

    /// An `oauth2` source with `members` added, under `auth`.
    private func oauth2(_ members: String, auth: String = "client_secret_basic") -> String {
        let credentials =
            auth == "private_key_jwt" ? #""privateKeyFile": "/run/secrets/client.pem""# : #""clientSecret": "s""#
        return
            #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/t", "clientID": "c", "clientAuth": "\#(auth)", \#(credentials), \#(members)}}]}"#
    }

    /// RFC 6749 §3.2: request parameters MUST NOT be included more than once. The broker sends
    /// these itself, under every client authentication (or, under client_secret_basic, the
    /// client's credentials go in the Authorization header, where the body may not add others).
    @Test(arguments: ["grant_type", "client_id", "client_secret", "client_assertion", "client_assertion_type"])
    func extraParamsMayNotHoldAParameterTheBrokerSends(_ name: String) {
        for auth in ["client_secret_basic", "client_secret_post", "private_key_jwt"] {
            #expect(
                configurationProblem(oauth2(#""extraParams": {"foo": "bar", "\#(name)": "x"}"#, auth: auth))
                    == "providers[0].source.extraParams.\(name): the broker sends \(name) itself; allowed: other parameters",
                "\(auth)")
        }
    }

    @Test(arguments: [
        ("scope", #""api""#), ("audience", #""https://a.example""#), ("resource", #""https://r.example""#),
    ])
    func extraParamsMayNotRepeatAParameterTheSourceSends(_ name: String, _ value: String) {
        #expect(
            configurationProblem(oauth2(#""\#(name)": \#(value), "extraParams": {"\#(name)": "other"}"#))
                == "providers[0].source.extraParams.\(name): source.\(name) is sent already; give one of them")
        #expect(configurationProblem(oauth2(#""extraParams": {"\#(name)": "other"}"#)) == nil, "sent once")
    }

    @Test func keysOfAnotherClientAuthenticationAreRefused() {
        for auth in ["client_secret_basic", "client_secret_post"] {
            #expect(
                configurationProblem(oauth2(#""privateKeyFile": "/run/secrets/client.pem""#, auth: auth))
                    == #"providers[0].source.privateKeyFile: applies only with clientAuth "private_key_jwt", not "\#(auth)""#
            )
            #expect(
                configurationProblem(oauth2(#""kid": "2026-11""#, auth: auth))
                    == #"providers[0].source.kid: applies only with clientAuth "private_key_jwt", not "\#(auth)""#)
        }
        for key in ["clientSecret", "clientSecretFile"] {
            #expect(
                configurationProblem(oauth2(#""\#(key)": "/run/secrets/s""#, auth: "private_key_jwt"))
                    == #"providers[0].source.\#(key): applies only with clientAuth "client_secret_basic" or "client_secret_post", not "private_key_jwt""#
            )
        }
        #expect(configurationProblem(oauth2(#""kid": "2026-11""#, auth: "private_key_jwt")) == nil)
    }

    /// As `clientSecretFile` must hold: one non-empty line. The message never shows the secret.
    @Test(arguments: ["", "a\\nb", "a\\r\\nb", "a\\rb", "a\\u2028b", "a\\u0085b", "\\n"])
    func anInlineClientSecretIsOneNonEmptyLine(_ secret: String) {
        let message = configurationProblem(
            #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "https://i.example/t", "clientID": "c", "clientSecret": "\#(secret)"}}]}"#
        )
        #expect(message == "providers[0].source.clientSecret: must be one non-empty line, as a clientSecretFile holds")
    }

    /// libcurl would send a URL's `user:password@` to the issuer as Basic credentials; the
    /// message does not repeat the URL, which holds the password.
    @Test func aTokenURLWithUserInformationIsRefusedWithoutShowingIt() {
        for (source, key) in [
            (#""type": "oauth2", "clientID": "c", "clientSecret": "s", "tokenURL""#, "tokenURL"),
            (#""type": "http", "url""#, "url"),
        ] {
            for url in ["http://user:pw-42@127.0.0.1/t", "https://pw-42@issuer.example:8443/t?x=1", "http://:pw-42@h"] {
                let message = configurationProblem(#"{"providers": [{"source": {\#(source): "\#(url)"}}]}"#)
                #expect(message?.hasPrefix("providers[0].source.\(key): has user information") == true, "\(url)")
                #expect(message?.contains("pw-42") == false)
            }
            for url in ["http://127.0.0.1/t?mail=a@b.example", "http://127.0.0.1/a@b", "http://127.0.0.1#a@b"] {
                #expect(configurationProblem(#"{"providers": [{"source": {\#(source): "\#(url)"}}]}"#) == nil, "\(url)")
            }
        }
    }

    /// A password holding `?`, `/` or `#` ends the authority early, and a port out of range or
    /// not a number is no port: libcurl refused each at every fetch ("URL using bad/illegal
    /// format"), where the configuration passed. The message never shows the password.
    @Test func aURLWhoseHostAndPortLibcurlCannotUseIsRefused() {
        for (source, key) in [
            (#""type": "oauth2", "clientID": "c", "clientSecret": "s", "tokenURL""#, "tokenURL"),
            (#""type": "http", "url""#, "url"),
        ] {
            func problem(_ url: String) -> String? {
                configurationProblem(#"{"providers": [{"source": {\#(source): "\#(url)"}}]}"#)
            }
            for url in [
                "http://user:Pa?ssw0rd-42@127.0.0.1:21001/token", "http://user:Pa/ssw0rd-42@127.0.0.1/t",
                "http://user:Pa#ssw0rd-42@127.0.0.1/t",
            ] {
                #expect(problem(url)?.hasPrefix("providers[0].source.\(key): has user information") == true, "\(url)")
                #expect(problem(url)?.contains("ssw0rd-42") == false)
            }
            for url in [
                "http://127.0.0.1:abc/token", "http://127.0.0.1:99999/token", "http://127.0.0.1:0/t",
                "http://[::1/token", "http://127.0.0.1:/t", "http://[]:80/t", "http://exa%6Dple.com/t",
                "https://x:443:443/t",
            ] {
                #expect(
                    problem(url)
                        == "providers[0].source.\(key): \"\(url)\" has no host and port libcurl could use; allowed: HOST or HOST:PORT (a name, an IPv4 address or a bracketed IPv6 one; PORT 1-65535)",
                    "\(url)")
            }
            // A query or fragment may hold a credential: the message shows the URL without them.
            for (url, shown) in [
                ("http://127.0.0.1:1/t?token=SECRET-42 {{x}}", "http://127.0.0.1:1/t?..."),
                ("ftp://h/t#sig=SECRET-42", "ftp://h/t?..."),
                ("http://127.0.0.1:99999/t?api_key=SECRET-42", "http://127.0.0.1:99999/t?..."),
                // A scheme refused before the user information is looked at: still hidden.
                ("ftp://client:SECRET-42@issuer.example/token", "ftp://...@issuer.example/token"),
                ("gopher://u:pa/SECRET-42@h/t", "gopher://...@h/t"),
            ] {
                #expect(problem(url)?.contains("\"\(shown)\"") == true, "\(url): \(problem(url) ?? "accepted")")
                #expect(problem(url)?.contains("SECRET-42") == false)
            }
            for url in [
                "http://127.0.0.1:65535/t", "https://[::1]:8443/t", "https://[fe80::1]/t", "http://token_broker/t",
                "https://login.example.com?x=1", "HTTPS://ISSUER.EXAMPLE:1/t#f",
            ] {
                #expect(problem(url) == nil, "\(url)")
            }
        }
    }

    @Test func wrongTypesAndBrokenJSONAreExplained() {
        #expect(configurationProblem(#"{"providers": {}}"#) == "providers: must be an array, not an object")
        #expect(
            configurationProblem(#"{"providers": [{"pauseWhenIdle": "yes"}]}"#)
                == "providers[0].pauseWhenIdle: must be true or false, not a string")
        #expect(configurationProblem("{") != nil)
        #expect(configurationProblem("[]") == "must be an object, not an array")
        #expect(configurationProblem(#"{"providers": []}"#) == "providers: must list at least one provider")
    }

    @Test func duplicateProviderNamesAreRefused() {
        #expect(
            configurationProblem(#"{"providers": [{"name": "a"}, {"name": "a"}]}"#)
                == #"providers[1].name: duplicate provider name "a"; allowed: names unique across providers"#)
    }

    @Test func hs256NeedsAKeyFile() {
        #expect(
            configurationProblem(#"{"providers": [{"source": {"algorithm": "HS256"}}]}"#)?.hasPrefix(
                "providers[0].source.keyFile: is required with HS256") == true)
    }

    @Test func theEnvironmentOverridesTheListeners() throws {
        var configuration = try parse(#"{"listen": "127.0.0.1:1000", "adminListen": "127.0.0.1:1001"}"#)
        try configuration.applyEnvironment([
            "TOKEN_BROKER_LISTEN": "[::1]:0", "TOKEN_BROKER_ADMIN_LISTEN": "0.0.0.0:9999",
        ])
        #expect(configuration.listen.description == "[::1]:0")
        #expect(configuration.adminListen.description == "0.0.0.0:9999")
        #expect(throws: ConfigurationError.self) {
            try configuration.applyEnvironment(["TOKEN_BROKER_LISTEN": "localhost:80"])
        }
    }

    @Test func aListenerClashNamesTheVariableWhereTheValueCameFromTheEnvironment() throws {
        let file = try parse(#"{"listen": "127.0.0.1:1000", "adminListen": "127.0.0.1:1001"}"#)
        let cases: [(environment: [String: String], key: String, problem: String)] = [
            (
                ["TOKEN_BROKER_LISTEN": "127.0.0.1:1001"], "adminListen",
                "127.0.0.1:1001 is also listen (from TOKEN_BROKER_LISTEN)"
            ),
            (
                ["TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:1000"], "adminListen (from TOKEN_BROKER_ADMIN_LISTEN)",
                "127.0.0.1:1000 is also listen"
            ),
            (
                ["TOKEN_BROKER_LISTEN": "127.0.0.1:7", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:7"],
                "adminListen (from TOKEN_BROKER_ADMIN_LISTEN)", "127.0.0.1:7 is also listen (from TOKEN_BROKER_LISTEN)"
            ),
        ]
        for (environment, key, problem) in cases {
            var configuration = file
            #expect(throws: ConfigurationError(key: key, problem + "; allowed: a different address or port")) {
                try configuration.applyEnvironment(environment)
            }
        }
        // A clash within the file names the file's keys alone.
        #expect(
            configurationProblem(#"{"listen": "127.0.0.1:5", "adminListen": "127.0.0.1:5"}"#)
                == "adminListen: 127.0.0.1:5 is also listen; allowed: a different address or port")
    }

    @Test(arguments: [
        // A wildcard takes its port on every address of its family.
        ("0.0.0.0:80", "127.0.0.1:80", true), ("10.0.0.1:80", "0.0.0.0:80", true), ("0.0.0.0:80", "0.0.0.0:80", true),
        ("[::]:80", "[::1]:80", true), ("[2001:db8::1]:80", "[0:0:0:0:0:0:0:0]:80", true),
        // One address written two ways.
        ("[::1]:80", "[0:0:0:0:0:0:0:1]:80", true), ("[FE80::1]:80", "[fe80::1]:80", true),
        ("unix:/run/a.sock", "unix:/run/a.sock", true),
        // Bindable together: IPv6 listeners are IPv6-only, so [::] leaves IPv4 alone.
        ("0.0.0.0:80", "[::]:80", false), ("[::]:80", "127.0.0.1:80", false), ("127.0.0.1:80", "127.0.0.2:80", false),
        ("0.0.0.0:80", "127.0.0.1:81", false), ("0.0.0.0:0", "127.0.0.1:0", false), ("0.0.0.0:0", "0.0.0.0:0", false),
        ("unix:/run/a.sock", "unix:/run/b.sock", false), ("unix:/run/a.sock", "0.0.0.0:80", false),
    ])
    func listenersOverlapWhenTheyCannotBothBind(_ first: String, _ second: String, _ overlapping: Bool) throws {
        let (a, b) = (try ListenAddress(parsing: first), try ListenAddress(parsing: second))
        #expect(a.overlaps(b) == overlapping)
        #expect(b.overlaps(a) == overlapping)
    }

    @Test func listenersThatCannotBothBindAreRefused() {
        #expect(
            configurationProblem(#"{"listen": "0.0.0.0:47251", "adminListen": "127.0.0.1:47251"}"#)
                == "adminListen: 127.0.0.1:47251 overlaps listen 0.0.0.0:47251: 0.0.0.0 takes port 47251 on every IPv4"
                + " address; allowed: a different port")
        #expect(
            configurationProblem(#"{"listen": "[::1]:9", "adminListen": "[::]:9"}"#)
                == "adminListen: [::]:9 overlaps listen [::1]:9: :: takes port 9 on every IPv6 address; allowed: a"
                + " different port")
        #expect(
            configurationProblem(#"{"listen": "[::1]:9", "adminListen": "[0:0:0:0:0:0:0:1]:9"}"#)
                == "adminListen: [0:0:0:0:0:0:0:1]:9 is also listen, written [::1]:9; allowed: a different address"
                + " or port")
        #expect(configurationProblem(#"{"listen": "0.0.0.0:9", "adminListen": "[::]:9"}"#) == nil)
        #expect(configurationProblem(#"{"listen": "0.0.0.0:9", "adminListen": "127.0.0.1:10"}"#) == nil)
    }

    @Test func aListenerIsReadLenientlyForTheCommandsThatAskTheBroker() throws {
        func document(_ json: String) throws -> JSONValue { try BrokerConfiguration.document(Array(json.utf8)) }
        let typo = try document(
            #"{"adminListen": "unix:/run/a.sock", "providers": [{"name": "a"}, {"name": "a"}], "bogus": 1}"#)
        #expect(try BrokerConfiguration.listener(.adminListen, in: typo).description == "unix:/run/a.sock")
        #expect(try BrokerConfiguration.listener(.listen, in: typo).description == "127.0.0.1:8080")
        #expect(try BrokerConfiguration.listener(.adminListen, in: nil).description == "127.0.0.1:9090")
        #expect(
            throws: ConfigurationError(key: "listen", "is null; leave the key out for its default, or give a value")
        ) {
            try BrokerConfiguration.listener(.listen, in: try document(#"{"listen": null}"#))
        }
        #expect(throws: ConfigurationError.self) {
            try BrokerConfiguration.listener(.listen, in: try document(#"{"listen": "127.0.0.1"}"#))
        }
        #expect(throws: ConfigurationError.self) { try BrokerConfiguration.listener(.listen, in: try document("1")) }
        #expect(
            try BrokerConfiguration.listener(.listen, environment: ["TOKEN_BROKER_LISTEN": "[::1]:1"])?.description
                == "[::1]:1")
        #expect(try BrokerConfiguration.listener(.adminListen, environment: ["TOKEN_BROKER_LISTEN": "[::1]:1"]) == nil)
        // Set but empty: the file's (a container cannot unset the image's variables, only empty them).
        #expect(try BrokerConfiguration.listener(.adminListen, environment: ["TOKEN_BROKER_ADMIN_LISTEN": ""]) == nil)
        #expect(BrokerConfiguration.reloadTimeoutSec(in: typo) == 30)
        #expect(BrokerConfiguration.reloadTimeoutSec(in: nil) == 30)
        #expect(BrokerConfiguration.reloadTimeoutSec(in: try document(#"{"reloadTimeoutSec": 600, "x": 1}"#)) == 600)
        #expect(BrokerConfiguration.reloadTimeoutSec(in: try document(#"{"reloadTimeoutSec": 601}"#)) == nil)
        #expect(BrokerConfiguration.reloadTimeoutSec(in: try document("[]")) == nil)
    }

    @Test func aListenerVariableSetButEmptyMeansTheFilesListener() throws {
        // The image sets both variables; a container can only empty them to use the file's.
        var configuration = try parse(#"{"listen": "127.0.0.1:1000", "adminListen": "127.0.0.1:1001"}"#)
        try configuration.applyEnvironment(["TOKEN_BROKER_LISTEN": "", "TOKEN_BROKER_ADMIN_LISTEN": ""])
        #expect(configuration.listen.description == "127.0.0.1:1000")
        #expect(configuration.adminListen.description == "127.0.0.1:1001")
    }

    @Test(arguments: ["127.0.0.1:8080", "0.0.0.0:0", "[::1]:9090", "[::]:1", "unix:/run/token-broker/token.sock"])
    func listenAddressesRoundTrip(_ text: String) throws {
        #expect(try ListenAddress(parsing: text).description == text)
    }

    @Test func unixSocketsAreLoopbackAndCarryAFileMode() throws {
        let configuration = try parse(#"{"listen": "unix:/tmp/t.sock", "unixSocketMode": "0640"}"#)
        #expect(configuration.listen.unixPath == "/tmp/t.sock" && configuration.listen.isLoopback)
        #expect(configuration.unixSocketMode == 0o640)
        #expect(try parse("{}").unixSocketMode == 0o660)
        for mode in ["0777x", "0500", "640x", "rw-", "01777"] {
            #expect(throws: ConfigurationError.self) { try parse(#"{"unixSocketMode": "\#(mode)"}"#) }
        }
        #expect(throws: ConfigurationError.self) {
            try parse(#"{"listen": "unix:/a.sock", "adminListen": "unix:/a.sock"}"#)
        }
    }

    @Test(arguments: [
        "localhost:80", "127.0.0.1", "127.0.0.1:65536", "1.2.3:4", "[::1]9090", "01.2.3.4:5", "",
        "unix:relative.sock", "unix:", "unix:/dir/", "unix:/" + String(repeating: "a", count: 120),
        "[:::::]:8080", "[1:2:3:4:5:6:7:8:9]:80", "[::1::2]:80", "[12345::]:80", "[::1.2.3]:80", "[.]:80",
        "[fe80::1%eth0]:80",
        // A sign, which UInt8 and UInt16 alone would take and no listener can bind.
        "127.0.0.+1:8080", "+127.0.0.1:8080", "127.0.0.1:+8080", "[::1]:+8080", "127.0.0.1: 8080",
        // IPv4-mapped, which an IPv6-only listener cannot bind: the broker failed at start with EINVAL.
        "[::ffff:127.0.0.1]:80", "[::FFFF:7f00:1]:80", "[0:0:0:0:0:ffff:10.0.0.1]:80",
    ])
    func malformedListenAddressesAreRefused(_ text: String) {
        #expect(throws: ConfigurationError.self) { try ListenAddress(parsing: text) }
    }

    @Test(arguments: ["[::fffe:127.0.0.1]:80", "[2001:db8::1]:443", "[0:0:0:0:0:0:0:1]:8080", "[FE80::1]:1"])
    func everyIPv6FormTheSystemAcceptsIsAccepted(_ text: String) throws {
        #expect(try ListenAddress(parsing: text).description == text)
    }

    @Test func relativePathsAreResolvedAgainstTheConfigurationFilesDirectory() throws {
        var configuration = try parse(
            #"""
            {"clientKeysFile": "callers.json",
             "providers": [
               {"name": "a", "source": {"type": "jwt", "keyFile": "keys/key.pem"}},
               {"name": "b", "source": {"type": "file", "path": "./token.txt"}},
               {"name": "c", "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "x",
                                        "clientSecretFile": "secret", "caFile": "/etc/ca.pem", "clientCertFile": "c.pem", "clientKeyFile": "k.pem"}},
               {"name": "d", "source": {"type": "http", "url": "https://issuer.example/t", "headers": {"X-Key": {"file": "api-key"}, "X-Plain": "v"}}}],
             "proxies": [{"name": "p", "target": "https://api.example/", "caFile": "ca.pem"}]}
            """#)
        configuration.resolvePaths(relativeTo: BrokerConfiguration.directory(of: "/etc/tb/config.json"))
        #expect(configuration.clientKeysFile == "/etc/tb/callers.json")
        guard case .jwt(let jwt) = configuration.providers[0].source,
            case .file(let file) = configuration.providers[1].source,
            case .oauth2(let oauth2) = configuration.providers[2].source,
            case .http(let http) = configuration.providers[3].source
        else {
            Issue.record("sources read wrongly")
            return
        }
        #expect(jwt.keyFile == "/etc/tb/keys/key.pem")
        #expect(file.path == "/etc/tb/./token.txt")
        #expect(oauth2.clientSecretFile == "/etc/tb/secret")
        #expect(oauth2.upstream.caFile == "/etc/ca.pem", "absolute paths are kept")
        #expect(oauth2.upstream.clientCertFile == "/etc/tb/c.pem" && oauth2.upstream.clientKeyFile == "/etc/tb/k.pem")
        #expect(http.headers["X-Key"] == .file("/etc/tb/api-key") && http.headers["X-Plain"] == .value("v"))
        #expect(configuration.proxies[0].upstream.caFile == "/etc/tb/ca.pem")
    }

    /// What a token file may not be written over: every file path the configuration names but
    /// the token files' own, resolved as the broker resolves them, and the configuration file.
    @Test func filesUsedAreEveryFileTheConfigurationNamesButTheTokenFiles() throws {
        var configuration = try parse(
            #"""
            {"clientKeysFile": "callers.json", "listen": "unix:/run/tb/token.sock",
             "providers": [
               {"name": "a", "source": {"type": "jwt", "keyFile": "key.pem"}},
               {"name": "b", "source": {"type": "file", "path": "token.txt"}},
               {"name": "c", "source": {"type": "oauth2", "tokenURL": "https://issuer.example/token", "clientID": "x",
                                        "clientSecretFile": "secret", "caFile": "/etc/ca.pem"}}],
             "sinks": [{"provider": "a", "path": "a.token"}],
             "store": {"type": "file", "path": "records", "keyFile": "store.key"}}
            """#)
        #expect(configuration.filesUsed.contains("key.pem"))
        configuration.resolvePaths(relativeTo: "/etc/tb")
        configuration.configurationFile = "/etc/tb/config.json"
        #expect(
            Set(configuration.filesUsed) == [
                "/etc/tb/config.json", "/etc/tb/callers.json", "/etc/tb/key.pem", "/etc/tb/token.txt",
                "/etc/tb/secret", "/etc/ca.pem", "/etc/tb/records", "/etc/tb/store.key", "/run/tb/token.sock",
            ])
        #expect(!configuration.filesUsed.contains("/etc/tb/a.token"), "the token files are not among them")
        #expect(configuration.sinks[0].path == "/etc/tb/a.token", "listing them changed nothing")
    }

    @Test func theDirectoryOfAConfigurationFile() {
        #expect(BrokerConfiguration.directory(of: "/etc/tb/config.json") == "/etc/tb")
        #expect(BrokerConfiguration.directory(of: "/config.json") == "/")
        #expect(BrokerConfiguration.directory(of: "config.json") == ".")
        #expect(BrokerConfiguration.directory(of: "conf/config.json") == "conf")
    }
}

@Suite struct CookieAndSourceConfigurationTests {
    @Test func cookieSettingsAreReadAndChecked() throws {
        let configuration = try BrokerConfiguration(
            json: Array(
                #"{"providers": [{"setTokenCookie": true, "tokenCookieName": "t", "domainName": "a.test", "tokenCookiePath": "/x"}]}"#
                    .utf8))
        let cookie = configuration.providers[0].cookie
        #expect(
            cookie.setCookieHeader(token: "abc", maxAge: 60)
                == "t=abc; Domain=a.test; Path=/x; Max-Age=60; Secure; HttpOnly; SameSite=Lax")
        #expect(
            configurationProblem(#"{"providers": [{"tokenCookieName": "a b"}]}"#)?.hasPrefix(
                "providers[0].tokenCookieName:") == true)
        #expect(
            configurationProblem(#"{"providers": [{"domainName": "a.test; Secure"}]}"#)?.hasPrefix(
                "providers[0].domainName:") == true)
        #expect(
            configurationProblem(#"{"providers": [{"tokenCookiePath": "x"}]}"#)
                == #"providers[0].tokenCookiePath: must start with "/""#)
    }

    @Test(arguments: ["example.com evil", "a,b.test", "", #"a.test\t"#, "é.test", "a_b.test"])
    func aCookieDomainIsAHostName(_ domain: String) {
        // A blank or a comma would end the attribute early, or split the `Set-Cookie` line in a
        // proxy that joins repeated headers with commas.
        #expect(
            configurationProblem(#"{"providers": [{"domainName": "\#(domain)"}]}"#)
                == #"providers[0].domainName: must be a host name: ASCII letters, digits, "-" and ".""#)
    }

    @Test(arguments: ["/a b", "/a,b", #"/a\u007f"#, "/a;b"])
    func aCookiePathIsVisibleASCIIWithoutSemicolonOrComma(_ path: String) {
        #expect(
            configurationProblem(#"{"providers": [{"tokenCookiePath": "\#(path)"}]}"#)
                == #"providers[0].tokenCookiePath: must be visible ASCII without ";" and ",""#)
    }

    @Test func theFileSourceNeedsAPath() throws {
        #expect(
            configurationProblem(#"{"providers": [{"source": {"type": "file"}}]}"#)?.hasPrefix(
                "providers[0].source.path: is required") == true)
        let configuration = try BrokerConfiguration(
            json: Array(#"{"providers": [{"source": {"type": "file", "path": "/t", "lifetimeSec": 60}}]}"#.utf8))
        #expect(configuration.providers[0].source == .file(FileSourceConfiguration(path: "/t", lifetimeSec: 60)))
        #expect(
            configurationProblem(#"{"providers": [{"source": {"type": "file", "path": "/t", "algorithm": "ES256"}}]}"#)?
                .hasPrefix("providers[0].source.algorithm: unknown key") == true)
    }

    @Test func theRequestGuardIsOnUnlessTurnedOff() throws {
        #expect(try BrokerConfiguration(json: Array("{}".utf8)).requestGuard)
        #expect(try !BrokerConfiguration(json: Array(#"{"requestGuard": false}"#.utf8)).requestGuard)
    }

    @Test func logsAreLogfmtUnlessJSONIsAsked() throws {
        #expect(try BrokerConfiguration(json: Array("{}".utf8)).logFormat == .logfmt)
        #expect(try BrokerConfiguration(json: Array(#"{"logFormat": "json"}"#.utf8)).logFormat == .json)
        #expect(try BrokerConfiguration(json: Array(#"{"logFormat": "logfmt"}"#.utf8)).logFormat == .logfmt)
        for refused in [#""JSON""#, #""xml""#, #""""#, "1", "true"] {
            #expect(
                configurationProblem(#"{"logFormat": \#(refused)}"#)?.hasPrefix("logFormat: ") == true, "\(refused)")
        }
    }

    @Test func theLogFormatIsFoundInADocumentWhateverElseItHolds() throws {
        func format(_ json: String) throws -> BrokerConfiguration.LogFormat? {
            BrokerConfiguration.logFormat(in: try BrokerConfiguration.document(Array(json.utf8)))
        }
        // Found before the rest is read: a duplicate provider name does not hide it.
        #expect(try format(#"{"logFormat": "json", "providers": [{"name": "a"}, {"name": "a"}]}"#) == .json)
        #expect(try format(#"{"logFormat": "logfmt", "listen": "nowhere"}"#) == .logfmt)
        for none in ["{}", #"{"logFormat": "xml"}"#, #"{"logFormat": 1}"#, #"{"logFormat": null}"#, #"["json"]"#] {
            #expect(try format(none) == nil, "\(none)")
        }
        #expect(throws: ConfigurationError.self) { try BrokerConfiguration.document(Array("{".utf8)) }
    }

    @Test func aHeaderValueOrURLWithAControlCharacterIsRefusedByteByByte() {
        // "\r\n" is one Character, equal to neither "\r" nor "\n": only a check of the bytes sees it.
        for value in [#"a\r\nb"#, #"\r\n"#, #"a\u0000b"#, #"a\u007fb"#, #"a\u001bb"#, #"a\rb"#, #"a\nb"#] {
            let json =
                #"{"providers": [{"source": {"type": "http", "url": "https://issuer.example/t", "headers": {"X-Key": "\#(value)"}}}]}"#
            #expect(
                configurationProblem(json)?.hasPrefix(
                    "providers[0].source.headers.X-Key: must be a string without control")
                    == true, "\(value)")
        }
        let tab =
            #"{"providers": [{"source": {"type": "http", "url": "https://issuer.example/t", "headers": {"X-Key": "a\tb"}}}]}"#
        #expect(configurationProblem(tab) == nil, "a tab is a blank a header value may hold")
        for url in [
            #"https://issuer.example/t\r\n"#, #"https://issuer.example/t\u0000"#, #"https://issuer.example/\u007ft"#,
            #"https://issuer.example/\tt"#,
        ] {
            let http = #"{"providers": [{"source": {"type": "http", "url": "\#(url)"}}]}"#
            #expect(configurationProblem(http)?.hasPrefix("providers[0].source.url: ") == true, "\(url)")
            let oauth2 =
                #"{"providers": [{"source": {"type": "oauth2", "tokenURL": "\#(url)", "clientID": "c", "clientSecret": "s"}}]}"#
            #expect(configurationProblem(oauth2)?.hasPrefix("providers[0].source.tokenURL: ") == true, "\(url)")
        }
    }
}
