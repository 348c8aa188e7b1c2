// The cloud SDKs' protocols (CompatAPI): Google's metadata server and Azure managed identity,
// over real templates whose children fetch from a source naming the values they were made for,
// and over a fake child for the SDKs' expiry margins. The real SDKs are run against the real
// binary by Tests/integration/test_compat.py.
import Synchronization
import Testing
import TokenBrokerServer
import TokenBrokerTestSupport

@testable import TokenBrokerAPI
@testable import TokenBrokerCore

/// A template whose every request reaches one fake child, for the margin's rules.
final class OneChildTemplate: TemplateProviding {
    typealias Provider = FakeProvider
    let child = FakeProvider(name: "gcp")
    let lease: TemplateLease<FakeProvider>
    let configuration: ProviderConfiguration

    init(perRequest: Set<RequestParameter>) {
        var configuration = ProviderConfiguration(name: "gcp")
        configuration.perRequest = perRequest
        configuration.allowedScopes = [AllowPattern("read")!]
        configuration.allowedAudiences = [AllowPattern("https://svc.example/*")!]
        configuration.allowedResources = [AllowPattern("read")!]
        self.configuration = configuration
        lease = ChildLease(child: child, attachment: TokenResponseCache(for: child), readAt: child.now)
    }

    var name: String { configuration.name }
    func status() -> TemplateStatus { TemplateStatus(name: name, maxChildren: 1) }
    func child(for values: TokenRequestValues) -> Result<
        (lease: TemplateLease<FakeProvider>, held: LeasedChild<FakeProvider>), ChildRefusal
    > {
        lease.renew(at: child.now).map { .success((lease, $0)) } ?? .failure(.stopped)
    }
    func renew(_ lease: TemplateLease<FakeProvider>) -> LeasedChild<FakeProvider>? { lease.renew(at: child.now) }
}

/// A template made as the broker makes one, on `ValuesSource`, with its own allow-lists.
private func template(
    _ name: String, _ perRequest: Set<RequestParameter>, scopes: [String] = [], audiences: [String] = [],
    resources: [String] = [], shared: ValuesSource.Shared
) -> LiveTemplate {
    var configuration = ProviderConfiguration(name: name)
    configuration.perRequest = perRequest
    configuration.allowedScopes = scopes.map { AllowPattern($0)! }
    configuration.allowedAudiences = audiences.map { AllowPattern($0)! }
    configuration.allowedResources = resources.map { AllowPattern($0)! }
    let settings = configuration
    return LiveTemplate(
        configuration: settings, clock: ContinuousClock(),
        makeChild: { values, _ in
            TokenProvider(configuration: settings, source: ValuesSource(values, shared: shared))
        },
        attach: { TokenResponseCache(for: $0) })
}

private let accounts = "/computeMetadata/v1/instance/service-accounts"
private let flavor = ("Metadata-Flavor", "Google")
private let secret = "app-service-secret"

@Suite struct CompatRoutesTests {
    let shared = ValuesSource.Shared()
    let templates: [LiveTemplate]
    let api: CompatAPI<TokenProvider<ContinuousClock>>

    init() {
        templates = [
            template("gcp", [.scope], scopes: ["read", "write"], shared: shared),
            template("gcp-id", [.audience], audiences: ["https://svc.example/*"], shared: shared),
            template("vault", [.scope], scopes: ["https://vault.azure.net/.default"], shared: shared),
            template("storage", [.resource], resources: ["https://storage.example/*"], shared: shared),
        ]
        var gce = GCEConfiguration(provider: "gcp", projectId: "proj-1", serviceAccountEmail: "b@proj-1.example")
        gce.identityProvider = "gcp-id"
        gce.scopes = ["read"]
        let azure = AzureConfiguration(
            identities: [
                .init(provider: "vault"), .init(provider: "storage", clientId: "client-2", objectId: "object-2"),
            ], identityHeaderFile: "header", imds: true)
        api = CompatAPI(
            gce: gce, azure: azure, identityHeader: Array(secret.utf8), templates: templates, maxWait: .seconds(30),
            listener: "token", metrics: BrokerMetrics(version: "test"))
    }

    private func gce(_ path: String, _ query: [(String, String)] = [], headers: [(String, String)] = [flavor])
        -> HTTPRequest
    {
        request(path, query: query, headers: headers, guarded: false)
    }

    private func imds(_ query: [(String, String)], headers: [(String, String)] = [("Metadata", "true")])
        -> HTTPRequest
    {
        request("/metadata/identity/oauth2/token", query: query, headers: headers, guarded: false)
    }

    private func appService(_ query: [(String, String)], secret sent: String? = secret) -> HTTPRequest {
        request(
            "/msi/token", query: query, headers: sent.map { [("X-IDENTITY-HEADER", $0)] } ?? [], guarded: false)
    }

    // MARK: - Google's metadata server

    @Test func everyMetadataAnswerCarriesTheFlavorAndEveryRequestMust() {
        let probe = api.handle(gce("/")).immediate
        #expect(probe?.status == 200 && probe?.bodyText == "computeMetadata/\n")
        #expect(probe?.header("Metadata-Flavor") == "Google")
        #expect(probe?.header("Content-Type")?.hasPrefix("text/plain") == true)
        let refused: [(HTTPRequest, Int, String)] = [
            (gce("/", headers: []), 403, "missing_metadata_flavor"),
            (gce("/", headers: [("Metadata-Flavor", "google-ish")]), 403, "missing_metadata_flavor"),
            (gce("/", headers: [flavor, ("X-Forwarded-For", "10.0.0.1")]), 403, "forwarded_request"),
            (gce("/", headers: [flavor, ("Forwarded", "for=10.0.0.1")]), 403, "forwarded_request"),
            (gce("/computeMetadata/v1/instance/zone"), 404, "not_found"),
            (gce(accounts + "/other@example/token"), 404, "not_found"),
        ]
        for (request, status, code) in refused {
            let answer = api.handle(request).immediate
            #expect(answer?.status == status && answer?.errorCode == code, "\(request.path)")
            #expect(answer?.header("Metadata-Flavor") == "Google", "\(request.path)")
        }
        let post = api.handle(request("POST", "/", headers: [flavor], guarded: false)).immediate
        #expect(post?.status == 405 && post?.header("Allow") == "GET, HEAD")
        #expect(post?.header("Metadata-Flavor") == "Google")
    }

    @Test func theProjectAndTheAccountAreServedUnderDefaultAndTheEmail() {
        #expect(api.handle(gce("/computeMetadata/v1/project/project-id")).immediate?.bodyText == "proj-1")
        // Not configured: 404, which the SDKs read as googleapis.com.
        #expect(api.handle(gce("/computeMetadata/v1/universe/universe-domain")).immediate?.status == 404)
        for account in ["default", "b@proj-1.example"] {
            let info = api.handle(gce(accounts + "/\(account)/", [("recursive", "true")])).immediate
            #expect(info?.string("email") == "b@proj-1.example")
            #expect(info?.members["scopes"] == .array([.string("read")]))
            #expect(info?.header("Content-Type") == "application/json")
            #expect(api.handle(gce(accounts + "/\(account)/email")).immediate?.bodyText == "b@proj-1.example")
        }
        let listing = api.handle(gce(accounts + "/")).immediate?.bodyText
        #expect(listing == "default/\nb@proj-1.example/\n")
        let notRecursive = api.handle(gce(accounts + "/default/", [("recursive", "false")])).immediate
        #expect(notRecursive?.bodyText.contains("email") == true && notRecursive?.status == 200)
        #expect(notRecursive?.header("Content-Type") != "application/json")
    }

    /// `recursive` is `true` or `false`, given once: the first of two values was served, and
    /// anything else read as `false`; another server in front might read them otherwise.
    @Test(arguments: [[("recursive", "true"), ("recursive", "false")], [("recursive", "maybe")], [("recursive", "")]])
    func anAccountsRecursiveIsTrueOrFalseGivenOnce(_ query: [(String, String)]) {
        let answer = api.handle(gce(accounts + "/default/", query)).immediate
        #expect(answer?.status == 400 && answer?.errorCode == "invalid_request", "\(query)")
        #expect(answer?.header("Metadata-Flavor") == "Google")
    }

    @Test func anAccessTokenIsTheChildsForTheCommaSeparatedScopes() async {
        await running(templates) {
            let first = await answer(api.handle(gce(accounts + "/default/token", [("scopes", "write,read")])))
            #expect(first?.status == 200)
            #expect(first?.string("access_token") == "tok-1:scope=\"read+write\"")
            #expect(first?.string("token_type") == "Bearer")
            // A number, as google-auth requires: the child's 900 s, less what has passed.
            #expect((first?.int("expires_in")).map { (890...900).contains($0) } == true)
            #expect(first?.header("Metadata-Flavor") == "Google")
            // The same set in another order is the same child, answered from its cache.
            let again = api.handle(gce(accounts + "/default/token", [("scopes", "read,write")])).immediate
            #expect(again?.string("access_token") == "tok-1:scope=\"read+write\"")
            #expect(shared.count == 1)
            // No scopes: the account's configured ones.
            let plain = await answer(api.handle(gce(accounts + "/b@proj-1.example/token")))
            #expect(plain?.string("access_token") == "tok-2:scope=\"read\"")
            // Requests with and without scopes, taking turns, each find their own child at once.
            for _ in 0..<2 {
                let scoped = api.handle(gce(accounts + "/default/token", [("scopes", "read,write")])).immediate
                #expect(scoped?.string("access_token") == "tok-1:scope=\"read+write\"")
                let unscoped = api.handle(gce(accounts + "/default/token")).immediate
                #expect(unscoped?.string("access_token") == "tok-2:scope=\"read\"")
            }
            #expect(shared.count == 2)
        }
    }

    @Test func aScopeOutsideTheAllowListOrMalformedIs400AndFetchesNothing() async {
        await running(templates) {
            let cases: [(String, String)] = [
                ("admin", "value_not_allowed"), ("read,,write", "invalid_request"), ("", "invalid_request"),
            ]
            for (scopes, code) in cases {
                let refused = api.handle(gce(accounts + "/default/token", [("scopes", scopes)])).immediate
                #expect(refused?.status == 400 && refused?.errorCode == code, "\(scopes)")
                #expect(refused?.string("parameter") == "scope")
            }
            let twice = api.handle(gce(accounts + "/default/token", [("scopes", "read"), ("SCOPES", "write")]))
            #expect(twice.immediate?.status == 400)
            #expect(shared.count == 0 && templates[0].status().children == 0)
        }
    }

    @Test func anIdentityTokenIsTheBareTokenOfTheAudiencesChild() async {
        await running(templates) {
            let path = accounts + "/default/identity"
            let token = await answer(
                api.handle(gce(path, [("audience", "https://svc.example/a"), ("format", "full")])))
            #expect(token?.status == 200)
            #expect(token?.bodyText == "tok-1:audience=\"https://svc.example/a\"")
            #expect(token?.header("Content-Type")?.hasPrefix("text/plain") == true)
            #expect(api.handle(gce(path)).immediate?.errorCode == "invalid_request")
            #expect(
                api.handle(gce(path, [("audience", "https://svc.example/a"), ("format", "x")])).immediate?.status == 400
            )
            #expect(api.handle(gce(path, [("audience", "https://other.example")])).immediate?.status == 400)
            // `licenses` is TRUE or FALSE, once; it was not read at all.
            let audience = ("audience", "https://svc.example/a")
            let licensed = api.handle(gce(path, [audience, ("licenses", "TRUE")])).immediate
            #expect(licensed?.status == 200)
            for licenses in [[("licenses", "maybe")], [("licenses", "TRUE"), ("licenses", "FALSE")]] {
                let refused = api.handle(gce(path, [audience] + licenses)).immediate
                #expect(refused?.status == 400 && refused?.errorCode == "invalid_request", "\(licenses)")
            }
            #expect(shared.count == 1)
        }
    }

    // MARK: - Azure managed identity

    @Test func appServiceNeedsTheSecretAndAnswersExpiresOnInEpochSeconds() async {
        await running(templates) {
            let query = [("api-version", "2019-08-01"), ("resource", "https://vault.azure.net")]
            // Nothing, another length, and the same length with its last letter in capital.
            for sent in [nil, "wrong", secret + "x", String(secret.dropLast()), String(secret.dropLast()) + "T"] {
                let refused = api.handle(appService(query, secret: sent)).immediate
                #expect(refused?.status == 401 && refused?.errorCode == "invalid_identity_header")
                #expect(refused?.int("statusCode") == 401 && refused?.string("message")?.isEmpty == false)
            }
            #expect(shared.count == 0)
            let before = Int(WallTime().timeIntervalSince1970)
            let token = await answer(api.handle(appService(query)))
            // Bounded by the clock read after the answer too: a loaded machine may take seconds.
            let after = Int(WallTime().timeIntervalSince1970)
            #expect(token?.status == 200)
            // The template takes scopes: the resource is asked as `R/.default`.
            #expect(token?.string("access_token") == "tok-1:scope=\"https://vault.azure.net/.default\"")
            #expect(token?.string("resource") == "https://vault.azure.net")
            #expect((token?.int("expires_on")).map { (before + 899...after + 901).contains($0) } == true)
            #expect(token?.members["expires_in"] == nil)
        }
    }

    @Test func imdsNeedsTheMetadataHeaderAndNamesIdentitiesByOneID() async {
        await running(templates) {
            let base = [("api-version", "2018-02-01"), ("resource", "https://storage.example/a")]
            let refused: [(HTTPRequest, Int, String)] = [
                (imds(base, headers: []), 400, "missing_metadata_header"),
                (
                    imds(base, headers: [("Metadata", "true"), ("X-Forwarded-For", "10.0.0.1")]), 403,
                    "forwarded_request"
                ),
                (imds(base, headers: [("Metadata", "true"), ("forwarded", "for=10.0.0.1")]), 403, "forwarded_request"),
                (imds([("api-version", "2019-08-01"), ("resource", "r")]), 400, "invalid_request"),
                (imds([("api-version", "2018-02-01")]), 400, "invalid_request"),
                (imds(base + [("client_id", "nobody")]), 400, "identity_not_found"),
                (imds(base + [("client_id", "client-2"), ("object_id", "object-2")]), 400, "invalid_request"),
                // The system-assigned identity's template takes scopes: a space would name two.
                (
                    imds([("api-version", "2018-02-01"), ("resource", "https://vault.azure.net x")]), 400,
                    "invalid_request"
                ),
            ]
            for (request, status, code) in refused {
                let answer = api.handle(request).immediate
                #expect(answer?.status == status && answer?.errorCode == code, "\(request.query.pairs)")
                #expect(answer?.int("statusCode") == status)
            }
            #expect(shared.count == 0)
            for id in [("client_id", "client-2"), ("object_id", "object-2")] {
                let token = await answer(api.handle(imds(base + [id])))
                #expect(token?.status == 200)
                // That identity's template takes resources: the resource is asked as it is.
                #expect(token?.string("access_token") == "tok-1:resource=\"https://storage.example/a\"")
                #expect((token?.int("expires_in")).map { (890...900).contains($0) } == true)
                #expect(token?.int("expires_on") != nil && token?.string("token_type") == "Bearer")
            }
            #expect(shared.count == 1)
        }
    }

    @Test func appServiceIsNotServedWithoutAnIdentityHeaderFile() {
        let api = CompatAPI(
            gce: nil, azure: AzureConfiguration(identities: [.init(provider: "vault")]), identityHeader: nil,
            templates: templates, maxWait: .seconds(1), listener: "token", metrics: BrokerMetrics(version: "test"))
        #expect(!api.serves("/msi/token") && api.serves("/metadata/identity/oauth2/token") && !api.serves("/"))
    }

    @Test func imdsIsNotServedBesideAppServicesSecretUnlessAskedFor() async {
        func api(_ azure: AzureConfiguration) -> CompatAPI<TokenProvider<ContinuousClock>> {
            CompatAPI(
                gce: nil, azure: azure, identityHeader: Array(secret.utf8), templates: templates,
                maxWait: .seconds(30), listener: "token", metrics: BrokerMetrics(version: "test"))
        }
        let query = [("api-version", "2018-02-01"), ("resource", "https://vault.azure.net")]
        // With the secret, IMDS (which has none) is not served: 404, and nothing is fetched.
        let secured = api(AzureConfiguration(identities: [.init(provider: "vault")], identityHeaderFile: "header"))
        #expect(!secured.serves("/metadata/identity/oauth2/token") && secured.serves("/msi/token"))
        let refused = secured.handle(imds(query)).immediate
        #expect(refused?.status == 404 && refused?.errorCode == "not_found")
        #expect(shared.count == 0)
        // Asked for (`imds: true`), it is served beside App Service's route.
        let both = api(
            AzureConfiguration(identities: [.init(provider: "vault")], identityHeaderFile: "header", imds: true))
        #expect(both.serves("/metadata/identity/oauth2/token") && both.serves("/msi/token"))
        await running(templates) {
            let token = await answer(both.handle(imds(query)))
            #expect(token?.status == 200 && token?.string("resource") == "https://vault.azure.net")
        }
    }

    /// A wait the listener has no place for (`ServerRefusal.tooManyWaiting`) is refused in its
    /// route's protocol's shape, on the protocols' own listener and on the token listener, where
    /// the broker's own routes keep the broker's shape.
    @Test func aWaitWithoutAPlaceIsRefusedInItsProtocolsShape() {
        let google = api.refusal(.tooManyWaiting(path: accounts + "/default/token", places: 14))
        #expect(google.status == 503 && google.errorCode == "too_many_waiting")
        #expect(google.header("Metadata-Flavor") == "Google" && google.header("Retry-After") == "1")
        let azure = api.refusal(.tooManyWaiting(path: "/metadata/identity/oauth2/token", places: 14))
        #expect(azure.status == 503 && azure.errorCode == "too_many_waiting" && azure.int("statusCode") == 503)
        #expect(azure.header("Metadata-Flavor") == nil && azure.header("Retry-After") == "1")

        let token = TokenAPI(
            providers: [], templates: templates, jwks: "{}", maxWait: .seconds(30), compat: api,
            metrics: BrokerMetrics(version: "test"))
        let shared = token.refusal(.tooManyWaiting(path: "/msi/token", places: 14))
        #expect(shared.errorCode == "too_many_waiting" && shared.int("statusCode") == 503)
        let own = token.refusal(.tooManyWaiting(path: "/token/ready", places: 14))
        #expect(own.status == 503 && own.errorCode == "too_many_waiting")
        #expect(own.header("Metadata-Flavor") == nil && own.int("statusCode") == nil)
    }

    // MARK: - The SDKs' expiry margins

    private func marginAPI(_ template: OneChildTemplate) -> CompatAPI<FakeProvider> {
        CompatAPI(
            gce: GCEConfiguration(provider: "gcp", projectId: "p", serviceAccountEmail: "a@p"), azure: nil,
            identityHeader: nil, templates: [template], maxWait: .seconds(30), listener: "token",
            metrics: BrokerMetrics(version: "test"))
    }

    @Test func aTokenInsideGoogleAuthsMarginIsRefreshedOnceAndWaitedFor() {
        let template = OneChildTemplate(perRequest: [.scope])
        let old = FakeProvider.token("old", version: 4, lifetime: .seconds(3600))
        template.child.state.withLock { $0.read = .token(old, stale: false, secondsLeft: 200) }
        let reply = marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")]))
        let responder = RecordingResponder()
        #expect(reply.start(responder))
        #expect(
            template.child.state.withLock { $0.earlyRefreshes } == [4]
                && template.child.state.withLock { $0.refreshes }.isEmpty)
        #expect(template.child.onlyWaiter?.waiter.after == 4)
        template.child.completeWaiters(
            .token(FakeProvider.token("new", version: 5, lifetime: .seconds(3600)), stale: false))
        #expect(responder.responses.first?.string("access_token") == "new")
    }

    @Test func aTokenOutsideTheMarginOrNoLongerThanItOrRefusedARefreshIsServedAsItIs() {
        let cases:
            [(lifetime: Duration, left: Int, refresh: ProviderStateMachine<FakeProvider.Instant>.ForcedRefreshDecision)] =
                [
                    (.seconds(3600), 226, .refreshing(after: nil)),  // outside the margin
                    (.seconds(200), 100, .refreshing(after: nil)),  // a new token would be no better
                    (.seconds(3600), 100, .excessive(retryAfter: .seconds(10))),  // the refresh window is full
                ]
        for (lifetime, left, refresh) in cases {
            let template = OneChildTemplate(perRequest: [.scope])
            let token = FakeProvider.token("kept", version: 2, lifetime: lifetime)
            template.child.state.withLock {
                $0.read = .token(token, stale: false, secondsLeft: left)
                $0.refresh = refresh
            }
            let answer = marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")])).immediate
            #expect(answer?.string("access_token") == "kept" && answer?.int("expires_in") == left)
        }
    }

    @Test(arguments: [(false, 225), (true, 300)])
    func aTokenShowingExactlyTheMarginIsRefreshedSinceItsSecondsAreRoundedUp(azure: Bool, margin: Int) {
        // `secondsLeft` is rounded up: 225 means 224.x s left, which google-auth treats as
        // expired (at most 225 s left), and 300 means 299.x s, which msal does (under 300 s).
        let template = OneChildTemplate(perRequest: [.scope, .resource])
        let old = FakeProvider.token("old", version: 4, lifetime: .seconds(3600))
        template.child.state.withLock { $0.read = .token(old, stale: false, secondsLeft: margin) }
        let api = CompatAPI(
            gce: GCEConfiguration(provider: "gcp", projectId: "p", serviceAccountEmail: "a@p"),
            azure: AzureConfiguration(identities: [.init(provider: "gcp")]), identityHeader: nil,
            templates: [template], maxWait: .seconds(30), listener: "token", metrics: BrokerMetrics(version: "test"))
        let request =
            azure
            ? imds([("api-version", "2018-02-01"), ("resource", "read")])
            : gce(accounts + "/default/token", [("scopes", "read")])
        let responder = RecordingResponder()
        #expect(api.handle(request).start(responder))
        #expect(
            template.child.state.withLock { $0.earlyRefreshes } == [4]
                && template.child.state.withLock { $0.refreshes }.isEmpty)
        template.child.completeWaiters(
            .token(FakeProvider.token("new", version: 5, lifetime: .seconds(3600)), stale: false))
        #expect(responder.responses.first?.string("access_token") == "new")
    }

    @Test func aMarginRefreshIsForcedOncePerVersionAndWaitedForAFewSecondsAtMost() {
        let template = OneChildTemplate(perRequest: [.scope])
        let api = marginAPI(template)
        let old = FakeProvider.token("old", version: 4, lifetime: .seconds(3600))
        template.child.state.withLock { $0.read = .token(old, stale: false, secondsLeft: 200) }
        let first = RecordingResponder()
        let asked = ContinuousClock.now
        #expect(api.handle(gce(accounts + "/default/token", [("scopes", "read")])).start(first))
        let deadline = template.child.onlyWaiter?.waiter.deadline
        #expect(deadline.map { $0 <= asked.advanced(by: .seconds(3)) } == true)
        // The issuer hands the same token back: version 4 again; it is served, and not refreshed again.
        template.child.completeWaiters(.token(old, stale: false))
        #expect(first.responses.first?.string("access_token") == "old")
        let second = api.handle(gce(accounts + "/default/token", [("scopes", "read")])).immediate
        #expect(second?.string("access_token") == "old")
        #expect(
            template.child.state.withLock { $0.earlyRefreshes } == [4]
                && template.child.state.withLock { $0.refreshes }.isEmpty)
    }

    @Test func aLoopbackListenerRefusesAHostThatIsNotLocalAsARebindingPageSendsIt() {
        let local = [
            "127.0.0.1:8080", "127.1.2.3", "localhost:80", "LOCALHOST", "[::1]:9", "metadata.google.internal",
            "metadata", "169.254.169.254:80", "127.0.0.1", "[::1]", "127.255.255.255:65535",
            "METADATA.Google.internal:80",
        ]
        let foreign = [
            "evil.example:8080", "127.0.0.1.evil.example", "[::2]:80", "127.0.0.256", "localhost.evil", "",
            // An empty, long or lettered port; a broken literal; too few parts, an empty part, another /8.
            "127.0.0.1:", "127.0.0.1:123456", "localhost:8o", ":80", "[::1]:", "[::1]x", "[::1", "127.0.0",
            "127..0.1", "128.0.0.1", "127.0.0.1a", "1270.0.0.1", "127.0.0.1234",
        ]
        for host in local {
            #expect(api.handle(gce("/", headers: [flavor, ("Host", host)])).immediate?.status == 200, "\(host)")
        }
        for host in foreign {
            let refused = api.handle(gce("/", headers: [flavor, ("Host", host)])).immediate
            #expect(refused?.status == 403 && refused?.errorCode == "foreign_host", "\(host)")
            let azure = api.handle(
                imds([("api-version", "2018-02-01")], headers: [("Metadata", "true"), ("Host", host)]))
            #expect(azure.immediate?.errorCode == "foreign_host", "\(host)")
        }
        let open = CompatAPI(
            gce: GCEConfiguration(provider: "gcp", projectId: "p", serviceAccountEmail: "a@p"), azure: nil,
            identityHeader: nil, templates: templates, maxWait: .seconds(1), listener: "gce", checksHost: false,
            metrics: BrokerMetrics(version: "test"))
        #expect(open.handle(gce("/", headers: [flavor, ("Host", "broker.internal:8081")])).immediate?.status == 200)
        // A listener of the metadata server alone words even its 404 as the metadata server.
        #expect(open.handle(gce("/elsewhere")).immediate?.header("Metadata-Flavor") == "Google")
    }

    @Test func azureIdsMatchInAnyCaseAndAScopeTemplatesRefusalNamesTheResource() async {
        await running(templates) {
            let base = [("api-version", "2018-02-01"), ("resource", "https://storage.example/a")]
            let token = await answer(api.handle(imds(base + [("client_id", "CLIENT-2")])))
            #expect(token?.status == 200)
            let refused = api.handle(imds([("api-version", "2018-02-01"), ("resource", "https://other.example")]))
            #expect(refused.immediate?.errorCode == "value_not_allowed")
            #expect(refused.immediate?.string("parameter") == "resource")
        }
    }

    @Test func aTokenWithoutExpiryIsSaidToExpireWhenTheBrokerReplacesIt() {
        let template = OneChildTemplate(perRequest: [.resource])
        let token = FakeProvider.token("forever", version: 1, lifetime: nil)
        template.child.state.withLock { $0.read = .token(token, stale: false, secondsLeft: nil) }
        let api = CompatAPI(
            gce: nil, azure: AzureConfiguration(identities: [.init(provider: "gcp")]), identityHeader: nil,
            templates: [template], maxWait: .seconds(1), listener: "token", metrics: BrokerMetrics(version: "test"))
        let answer = api.handle(imds([("api-version", "2018-02-01"), ("resource", "read")])).immediate
        // Issued at 1_800_000_000 by the wall clock; tokenRefreshDelaySec 300.
        #expect(answer?.int("expires_on") == 1_800_000_300)
        #expect((answer?.int("expires_in")).map { (295...300).contains($0) } == true)
    }

    /// A child paused while idle stops refreshing: a token without expiry, issued more than
    /// `tokenRefreshDelaySec` (300 s) ago, is still served. Its answer says 1 s left, and
    /// `expires_on` says the same moment; it said the replacement time, 100 s in the past, which
    /// msal turns into a negative `expires_in`.
    @Test(arguments: [false, true])
    func aTokenWithoutExpiryPastItsReplacementIsSaidToExpireInASecondByBothFields(appService: Bool) {
        let template = OneChildTemplate(perRequest: [.resource])
        var token = FakeProvider.token("forever", version: 1, lifetime: nil)
        token.issuedAt = ContinuousClock.now.advanced(by: .seconds(-400))
        template.child.state.withLock { $0.read = .token(token, stale: false, secondsLeft: nil) }
        let api = CompatAPI(
            gce: nil,
            azure: AzureConfiguration(
                identities: [.init(provider: "gcp")], identityHeaderFile: appService ? "header" : nil, imds: true),
            identityHeader: Array(secret.utf8), templates: [template], maxWait: .seconds(1), listener: "token",
            metrics: BrokerMetrics(version: "test"))
        let request =
            appService
            ? self.appService([("api-version", "2019-08-01"), ("resource", "read")])
            : imds([("api-version", "2018-02-01"), ("resource", "read")])
        let answer = api.handle(request).immediate
        // Issued at 1_800_000_000 by the wall clock, 400 s ago by the provider's.
        #expect(answer?.int("expires_on") == 1_800_000_401)
        if !appService { #expect(answer?.int("expires_in") == 1) }
    }

    @Test func whetherAChildAwaitsItsFirstTokenComesFromTheReadNotFromALaterStatus() {
        // The status says a token was held (a first fetch ended just after the read); the read,
        // made under the provider's one lock, says the child awaited its first: the route waits.
        let template = OneChildTemplate(perRequest: [.scope])
        var status = FakeProvider.status(name: "gcp", phase: .fresh, version: 1)
        status.everHeldToken = true
        template.child.state.withLock {
            $0.read = .unavailable(wasPaused: false, awaitingFirstToken: true)
            $0.status = status
        }
        let first = FakeProvider.token("first", version: 1, lifetime: .seconds(900))
        let compat = RecordingResponder()
        #expect(marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")])).start(compat))
        let tokens = TokenAPI(
            providers: [], templates: [template], jwks: "{}", maxWait: .seconds(30),
            metrics: BrokerMetrics(version: "test"))
        let child = RecordingResponder()
        #expect(tokens.handle(request("/providers/gcp/token", query: [("scope", "read")])).start(child))
        template.child.completeWaiters(.token(first, stale: false))
        #expect(compat.responses.first?.string("access_token") == "first")
        #expect(child.responses.first?.string("access_token") == "first")
        // A child whose first fetch is done (the read says so) is refused at once, with no wait.
        template.child.state.withLock { $0.read = .unavailable(wasPaused: false, awaitingFirstToken: false) }
        let refused = marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")])).immediate
        #expect(refused?.errorCode == "token_unavailable")
        #expect(tokens.handle(request("/providers/gcp/token", query: [("scope", "read")])).immediate?.status == 503)
    }

    @Test func aChildPausedWhileIdleWhoseTokenExpiredWaitsForTheFetchItsReadRestarted() {
        // The read found the child paused with no valid token, and resumed it: the request
        // waits for the new token, as a new child's first request does, rather than get a 503.
        let template = OneChildTemplate(perRequest: [.scope])
        template.child.state.withLock { $0.read = .unavailable(wasPaused: true, awaitingFirstToken: false) }
        let asked = ContinuousClock.now
        let waiting = RecordingResponder()
        #expect(marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")])).start(waiting))
        let waiter = template.child.onlyWaiter?.waiter
        #expect(waiter?.after == nil && waiter?.onDemand == false)
        #expect(waiter.map { $0.deadline <= asked.advanced(by: .seconds(31)) } == true)
        template.child.completeWaiters(
            .token(FakeProvider.token("resumed", version: 7, lifetime: .seconds(3600)), stale: false))
        #expect(waiting.responses.first?.status == 200)
        #expect(waiting.responses.first?.string("access_token") == "resumed")
        // The wait ends without a token (the issuer failed until maxWait): 503, as for a new child.
        let failing = RecordingResponder()
        #expect(marginAPI(template).handle(gce(accounts + "/default/token", [("scopes", "read")])).start(failing))
        template.child.completeWaiters(.timedOut(current: nil, lastError: nil))
        #expect(failing.responses.first?.status == 503 && failing.responses.first?.errorCode == "token_unavailable")
    }

    // MARK: - On the token listener

    @Test func theTokenListenerHandsTheProtocolsPathsOverWithoutItsGuards() async {
        let tokens = TokenAPI(
            providers: [], templates: templates, jwks: "{}", maxWait: .seconds(30), callers: TemplateCallers(),
            compat: api, metrics: BrokerMetrics(version: "test"))
        await running(templates) {
            // No Token-Broker-Request header, no caller key: the protocol's own header is the guard.
            #expect(tokens.handle(gce("/")).immediate?.status == 200)
            let token = await answer(tokens.handle(gce(accounts + "/default/token")))
            #expect(token?.string("access_token") == "tok-1:scope=\"read\"")
            // The broker's own routes keep theirs.
            #expect(tokens.handle(request("/providers/gcp/token")).immediate?.errorCode == "missing_caller_key")
        }
    }

    @Test func everyPathTheProtocolsServePassesTheByteTestAndTheBrokersOwnRoutesDoNot() {
        let served =
            ["/", "/computeMetadata/", "/computeMetadata/v1/", "/computeMetadata/v1/project/project-id"]
            + ["default", "b@proj-1.example"].flatMap { name in
                ["/", "/email", "/aliases", "/scopes", "/token", "/identity"].map { accounts + "/" + name + $0 }
            } + ["/msi/token", "/metadata/identity/oauth2/token"]
        for path in served {
            #expect(api.serves(path), "\(path)")
            #expect(CompatAPI<TokenProvider<ContinuousClock>>.mayServe(path), "\(path)")
        }
        let own = [
            "/token", "/token/ready", "/token/refresh", "/providers/gcp/token", "/.well-known/jwks.json", "/proxy/u/x",
            "", "x", "//",
        ]
        for path in own { #expect(!CompatAPI<TokenProvider<ContinuousClock>>.mayServe(path), "\(path)") }
    }

    @Test func theTokenListenerHandsAzuresPathsOverToo() async {
        let tokens = TokenAPI(
            providers: [], templates: templates, jwks: "{}", maxWait: .seconds(30), callers: TemplateCallers(),
            compat: api, metrics: BrokerMetrics(version: "test"))
        await running(templates) {
            let query = [("api-version", "2018-02-01"), ("resource", "https://vault.azure.net")]
            let imdsToken = await answer(tokens.handle(imds(query)))
            #expect(imdsToken?.string("resource") == "https://vault.azure.net")
            let appQuery = [("api-version", "2019-08-01"), ("resource", "https://vault.azure.net")]
            #expect(await answer(tokens.handle(appService(appQuery)))?.string("token_type") == "Bearer")
            // A protocol's path it does not serve is the broker's 404.
            #expect(tokens.handle(request("/metadata/other")).immediate?.status == 404)
        }
    }
}

/// A real template on a manual clock, counting what the routes ask of it.
final class CountingTemplate: TemplateProviding {
    typealias Provider = TokenProvider<ManualClock>
    let clock = ManualClock()
    let template: ProviderTemplate<Provider, ChildAttachment, ManualClock>
    let lookUps = Mutex(0)
    let renewals = Mutex(0)

    init(maxChildren: Int = 100) {
        var configuration = ProviderConfiguration(name: "gcp")
        configuration.perRequest = [.scope]
        configuration.maxChildren = maxChildren
        configuration.childIdleSec = 60
        let settings = configuration
        let clock = clock
        template = ProviderTemplate(
            configuration: settings, clock: clock,
            makeChild: { _, _ in TokenProvider(configuration: settings, source: ScriptedSource(), clock: clock) },
            attach: { TokenResponseCache(for: $0) })
    }

    var name: String { template.name }
    var configuration: ProviderConfiguration { template.configuration }
    func status() -> TemplateStatus { template.status() }
    func child(for values: TokenRequestValues) -> Result<
        (lease: TemplateLease<Provider>, held: LeasedChild<Provider>), ChildRefusal
    > {
        lookUps.withLock { $0 += 1 }
        return template.child(for: values)
    }
    func renew(_ lease: TemplateLease<Provider>) -> LeasedChild<Provider>? {
        renewals.withLock { $0 += 1 }
        return template.renew(lease)
    }
}

@Suite struct CheckedValuesMemoTests {
    typealias Child = TokenProvider<ManualClock>

    /// A memo over `template` whose checks are counted in `checks`; the key "refused" fails its check.
    private func memo(_ template: CountingTemplate, _ checks: Lock<Int>) -> (String) throws(BadRequest) -> Child? {
        let memo = CheckedValuesMemo<String, Child>(template)
        return { key throws(BadRequest) in
            let found = try memo.child(for: key) { () throws(BadRequest) in
                checks.withLock { $0 += 1 }
                guard key != "refused" else { throw BadRequest(.missingParameter("scopes")) }
                return TokenRequestValues(scopes: [key])
            }
            return try? found.get().child
        }
    }

    @Test func theLastAcceptedKeysChildIsReadAgainWithoutALookUpAndARefusalIsNeverKept() throws {
        let template = CountingTemplate()
        defer { template.template.shutDown() }
        let checks = Lock(0)
        let child = memo(template, checks)
        let first = try child("a")
        #expect(first != nil && first?.name == "gcp")
        #expect(try child("a") === first)
        #expect(checks.withLock { $0 } == 1)
        #expect(template.lookUps.withLock { $0 } == 1, "the second request renewed the lease")
        #expect(template.renewals.withLock { $0 } == 1)
        #expect(throws: BadRequest.self) { try child("refused") }
        #expect(throws: BadRequest.self) { try child("refused") }
        #expect(try child("a") === first && child("b") !== first)
        #expect(checks.withLock { $0 } == 4)
        // Keys equal by `String`'s `==` but not byte for byte are two keys, each checked: KELVIN
        // SIGN and `K` (this test's check accepts both; the broker's refuse anything beyond ASCII).
        _ = try child("K")
        _ = try child("\u{212A}")
        #expect(checks.withLock { $0 } == 6)
    }

    @Test func aRenewalIsAReadAndADroppedChildIsReplacedWithoutCheckingAgain() throws {
        let template = CountingTemplate()
        defer { template.template.shutDown() }
        let checks = Lock(0)
        let child = memo(template, checks)
        let first = try child("a")
        template.clock.advance(by: .seconds(59))
        #expect(try child("a") === first)
        template.clock.advance(by: .seconds(59))
        template.template.sweep()
        #expect(template.status().children == 1, "the renewal at 59 s was a read")
        template.clock.advance(by: .seconds(1))
        template.template.sweep()
        #expect(template.status().children == 0)
        // The lease is ended: the memo asks the template, which makes a new child, with the values kept.
        let second = try child("a")
        #expect(second != nil && second !== first)
        #expect(checks.withLock { $0 } == 1)
        // The renewal of the dropped child's lease was refused, and the memo looked the values up.
        #expect(template.lookUps.withLock { $0 } == 2 && template.renewals.withLock { $0 } == 2)
    }

    @Test(arguments: [false, true])
    func aDroppedChildAndItsAnswersAreFreedWithoutWaitingForTheRoutesNextRequest(shuttingDown: Bool) async throws {
        let template = CountingTemplate()
        defer { template.template.shutDown() }
        let memo = CheckedValuesMemo<String, Child>(template)
        weak var child: Child?
        weak var answers: TokenResponseCache<Child.Instant>?
        do {
            // Only the memo and the template hold them once this block ends.
            let found = try memo.child(for: "a") { () throws(BadRequest) in TokenRequestValues(scopes: ["a"]) }.get()
            (child, answers) = (found.child, found.cache)
        }
        #expect(child != nil && answers != nil)
        if shuttingDown {
            template.template.shutDown()
        } else {
            template.clock.advance(by: .seconds(60))
            template.template.sweep()
        }
        #expect(template.status().children == 0)
        // The template let go of it and its task ended: nothing else holds the child, its token
        // and its rendered answers, though the memo still has "a" as its last key and its lease.
        #expect(await eventually { child == nil && answers == nil })
    }

    @Test func aTemplatesRefusalIsAskedAgainAndAShutDownTemplatesChildIsNeverRenewed() throws {
        let template = CountingTemplate(maxChildren: 1)
        let checks = Lock(0)
        let child = memo(template, checks)
        let first = try child("a")
        #expect(first != nil)
        #expect(try child("b") == nil, "past maxChildren")
        #expect(try child("b") == nil)
        #expect(template.lookUps.withLock { $0 } == 3, "a refusal keeps no child")
        #expect(checks.withLock { $0 } == 2, "but keeps the checked values")
        #expect(try child("a") === first)
        template.template.shutDown()
        #expect(try child("a") == nil, "the lease ended with the template")
    }
}

@Suite struct CompatHeadersTests {
    @Test func eachIsTheFirstOfItsNameInAnyCaseAsHeaderFindsIt() {
        let request = HTTPRequest(
            method: "GET", path: "/",
            headers: [
                ("Metadata-Flavos", "no"), ("metadata-FLAVOR", "Google"), ("Metadata-Flavor", "second"),
                ("X-FORWARDED-FOR", "10.0.0.1"), ("Metadatum", "no"), ("METADATA", "true"), ("metadata", "false"),
                ("x-identity-header", "secret"), ("Hos", "no"), ("HoSt", "127.0.0.1"), ("Forwarder", "no"),
                ("FORWARDED", "for=10.0.0.2"),
            ])
        let headers = CompatHeaders.read(request)
        func text(_ field: CompatHeaders.Field) -> String? {
            headers.withValue(field) { $0.map { String(decoding: $0, as: UTF8.self) } }
        }
        #expect(text(.metadataFlavor) == "Google")
        #expect(text(.forwardedFor) == "10.0.0.1")
        #expect(text(.forwarded) == "for=10.0.0.2")
        #expect(text(.metadata) == "true")
        #expect(text(.identityHeader) == "secret")
        #expect(text(.host) == "127.0.0.1")
        // The same values as the look-up by name, header by header.
        #expect(text(.metadataFlavor) == request.header("Metadata-Flavor"))
        #expect(text(.forwardedFor) == request.header("X-Forwarded-For"))
        #expect(text(.forwarded) == request.header("Forwarded"))
        #expect(text(.metadata) == request.header("Metadata"))
        #expect(text(.identityHeader) == request.header("X-IDENTITY-HEADER"))
        #expect(text(.host) == request.header("Host"))
        #expect(headers.has(.forwardedFor) && headers.has(.host))
        #expect(headers.value(.metadata, equalsIgnoringCase: "true"))
        #expect(!headers.value(.metadataFlavor, equalsIgnoringCase: "true"))
        let shouted = CompatHeaders.read(HTTPRequest(method: "GET", path: "/", headers: [("Metadata", "TRUE")]))
        #expect(shouted.value(.metadata, equalsIgnoringCase: "true"))
        let none = CompatHeaders.read(HTTPRequest(method: "GET", path: "/", headers: [("Accept", "*/*")]))
        #expect(!none.has(.forwardedFor) && !none.has(.host) && !none.has(.metadataFlavor) && !none.isRelayed)
        #expect(none.withValue(.host) { $0 == nil } && none.withValue(.metadataFlavor) { $0 == nil })
        #expect(!none.value(.metadata, equalsIgnoringCase: "true"))
    }

    /// `sameText(utf8:_:)` on the UTF-8 of `text`.
    private func sameText(_ text: String?, _ expected: String) -> Bool {
        guard let text else { return TokenBrokerAPI.sameText(utf8: nil, expected) }
        return Array(text.utf8).withUnsafeBufferPointer { TokenBrokerAPI.sameText(utf8: $0, expected) }
    }

    @Test func textIsTheSameByItsBytesElseByStringComparison() {
        #expect(sameText("Google", "Google"))
        #expect(!sameText(nil, "Google") && !sameText("google", "Google") && !sameText("Googl", "Google"))
        // Canonically equivalent text is the same text, as `==` holds: KELVIN SIGN and `K`. A memo
        // key, compared byte for byte, is not; the second pair has the same length in bytes, so
        // that the bytes themselves (not the lengths) tell it apart.
        #expect(sameText("\u{212A}", "K"))
        #expect(!"\u{212A}".isExactly("K"))
        let marksInOneOrder = "e\u{301}\u{323}"
        let marksInTheOther = "e\u{323}\u{301}"
        #expect(marksInOneOrder.utf8.count == marksInTheOther.utf8.count && marksInOneOrder == marksInTheOther)
        #expect(sameText(marksInOneOrder, marksInTheOther) && !marksInOneOrder.isExactly(marksInTheOther))
        #expect("".isExactly("") && "abc".isExactly("abc") && !"abc".isExactly("abd") && !"ab".isExactly("abc"))
    }

    /// The routes compare header values read in place: each answer must be `String`'s `==`.
    @Test(arguments: [
        ("Google", "Google"), ("google", "Google"), ("Googl", "Google"), ("", "Google"), ("", ""),
        ("\u{212A}", "K"), ("e\u{301}\u{323}", "e\u{323}\u{301}"), ("Google ", "Google"),
    ])
    func textAsBytesIsTheSameAsTheStringComparisonSays(_ text: String, _ expected: String) {
        #expect(sameText(text, expected) == (text == expected))
        #expect(!sameText(nil, expected))
        // Bytes that are not UTF-8 compare as the replacement character they read as.
        #expect([0xFF].withUnsafeBufferPointer { TokenBrokerAPI.sameText(utf8: $0, "\u{FFFD}") })
    }
}
