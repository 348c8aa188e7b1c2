// The admin listener's routes: /healthz, /readyz, /metrics, and what is not one of them.
import Synchronization
import Testing
import TokenBrokerServer

@testable import TokenBrokerAPI
@testable import TokenBrokerCore

/// A template's status as the test sets it.
final class FakeTemplate: TemplateStatusReporting {
    let name: String
    let current: Mutex<TemplateStatus>

    init(name: String, maxChildren: Int = 100) {
        self.name = name
        current = Mutex(TemplateStatus(name: name, maxChildren: maxChildren))
    }

    func status() -> TemplateStatus { current.withLock { $0 } }
}

@Suite struct AdminRoutesTests {
    private func admin(
        _ providers: [FakeProvider], templates: [FakeTemplate] = [],
        tokenFiles: @escaping @Sendable () -> [AdminAPI.TokenFileReport] = { [] }
    ) -> AdminAPI {
        AdminAPI(
            providers: providers, templates: templates, tokenFiles: tokenFiles, metrics: BrokerMetrics(version: "test"))
    }

    @Test func readyzListsTokenFilesAndIsUnreadyWhileOneHoldsNoValidToken() {
        let ready = FakeProvider(name: "a")
        ready.state.withLock { $0.status = FakeProvider.status(name: "a", phase: .fresh, version: 3) }
        let files = Lock([
            AdminAPI.TokenFileReport(provider: "a", path: "/run/tb/a.token", version: 3, ready: true, lastError: nil)
        ])
        let api = admin([ready], tokenFiles: { files.withLock { $0 } })
        let written = api.handle(request("/readyz", guarded: false)).immediate
        #expect(written?.status == 200)
        #expect(
            written?.bodyText.contains(
                bytes: #""sinks":[{"provider":"a","path":"/run/tb/a.token","ready":true,"version":3}]}"#) == true)
        // The file's token expired while writes failed: the file is left as it is, and the broker is unready.
        files.withLock {
            $0[0].ready = false
            $0[0].lastError = "rename /run/tb/a.token: Permission denied"
        }
        let failing = api.handle(request("/readyz", guarded: false)).immediate
        #expect(failing?.status == 503 && failing?.bool("ready") == false)
        #expect(
            failing?.bodyText.contains(
                bytes: #"{"provider":"a","path":"/run/tb/a.token","ready":false,"version":3,"#
                    + #""last_error":"rename /run/tb/a.token: Permission denied"}"#) == true)
        // The file's directory was replaced: its writes go where readers of the path no longer look.
        files.withLock {
            $0[0].lastError = nil
            $0[0].problem = "the directory /run/tb was renamed or replaced since the broker opened it"
        }
        let replaced = api.handle(request("/readyz", guarded: false)).immediate
        #expect(replaced?.status == 503)
        #expect(
            replaced?.bodyText.contains(
                bytes: #"{"provider":"a","path":"/run/tb/a.token","ready":false,"version":3,"#
                    + #""problem":"the directory /run/tb was renamed or replaced since the broker opened it"}"#) == true
        )
    }

    /// Once the broker begins to stop, it is not ready, though its providers still hold tokens:
    /// its token listener takes no new connection.
    @Test func readyzIsUnreadyOnceTheBrokerIsStopping() {
        let ready = FakeProvider(name: "a")
        ready.state.withLock { $0.status = FakeProvider.status(name: "a", phase: .fresh, version: 3) }
        let stopping = Lock(false)
        let api = AdminAPI(
            providers: [ready], metrics: BrokerMetrics(version: "test"), stopping: { stopping.withLock { $0 } })
        let running = api.handle(request("/readyz", guarded: false)).immediate
        #expect(running?.status == 200 && running?.bool("ready") == true && running?.bool("stopping") == false)
        stopping.withLock { $0 = true }
        let stopped = api.handle(request("/readyz", guarded: false)).immediate
        #expect(stopped?.status == 503 && stopped?.bool("ready") == false && stopped?.bool("stopping") == true)
        #expect(
            stopped?.bodyText.contains(bytes: #""name":"a","ready":true"#) == true, "the provider's own detail stays")
    }

    @Test func healthzAnswersWhileTheProcessRuns() {
        let api = admin([FakeProvider()])
        let response = api.handle(request("/healthz", guarded: false)).immediate
        #expect(response?.status == 200 && response?.bodyText == #"{"status":"ok"}"#)
        #expect(response?.header("Content-Type") == "application/json")
        #expect(api.handle(request("HEAD", "/healthz", guarded: false)).immediate?.status == 200)
    }

    @Test func readyzIsReadyWhenEveryProviderCanAnswer() {
        let ready = FakeProvider(name: "a")
        ready.state.withLock { $0.status = FakeProvider.status(name: "a", phase: .fresh, version: 3) }
        let paused = FakeProvider(name: "b")
        paused.state.withLock { $0.status = FakeProvider.status(name: "b", phase: .paused, version: 1, stale: true) }
        let response = admin([ready, paused]).handle(request("/readyz", guarded: false)).immediate
        #expect(response?.status == 200)
        #expect(
            response?.bodyText
                == #"{"ready":true,"stopping":false,"providers":[{"name":"a","ready":true,"state":"fresh","stale":false,"version":3},"#
                + #"{"name":"b","ready":true,"state":"paused","stale":true,"version":1}],"templates":[],"sinks":[]}"#)
    }

    @Test func readyzIs503WhileAProviderCannotAnswer() {
        let ready = FakeProvider(name: "a")
        ready.state.withLock { $0.status = FakeProvider.status(name: "a", phase: .fresh, version: 3) }
        let failing = FakeProvider(name: "b")
        failing.state.withLock {
            $0.status = FakeProvider.status(name: "b", phase: .expired, lastError: .unreachable("connection refused"))
        }
        let response = admin([ready, failing]).handle(request("/readyz", guarded: false)).immediate
        #expect(response?.status == 503)
        #expect(response?.bool("ready") == false)
        guard case .array(let providers)? = response?.members["providers"], providers.count == 2,
            case .object(let second) = providers[1]
        else {
            Issue.record("no provider detail")
            return
        }
        #expect(second["ready"] == .bool(false) && second["state"] == .string("expired"))
        #expect(second["last_error"] == .string("unreachable"))
        #expect(second["version"] == nil)
    }

    @Test func readyzListsTemplatesAndOnlyHeldChildrenCount() {
        let ready = FakeProvider(name: "a")
        ready.state.withLock { $0.status = FakeProvider.status(name: "a", phase: .fresh, version: 3) }
        let template = FakeTemplate(name: "orders", maxChildren: 50)
        // Three children made by requests, one of them ready: the broker stays ready.
        template.current.withLock { status in
            status.children = 3
            status.ready = 1
        }
        let api = admin([ready], templates: [template])
        let response = api.handle(request("/readyz", guarded: false)).immediate
        #expect(response?.status == 200)
        #expect(
            response?.bodyText.contains(
                bytes: #""templates":[{"name":"orders","children":3,"ready":1,"max_children":50}],"sinks":[]}"#) == true
        )
        // A child held by a token file that is not ready makes the broker unready.
        template.current.withLock { status in
            status.children = 4
            status.held = [FakeProvider.status(name: "orders", phase: .expired)]
        }
        let unready = api.handle(request("/readyz", guarded: false)).immediate
        #expect(unready?.status == 503 && unready?.bool("ready") == false)
        template.current.withLock { status in
            status.ready = 2
            status.held = [FakeProvider.status(name: "orders", phase: .fresh, version: 1)]
        }
        #expect(api.handle(request("/readyz", guarded: false)).immediate?.status == 200)
        let metrics = api.handle(request("/metrics", guarded: false)).immediate
        #expect(metrics?.bodyText.contains(bytes: #"token_broker_template_children{provider="orders"} 4"#) == true)
        #expect(
            metrics?.bodyText.contains(bytes: #"token_broker_template_children_ready{provider="orders"} 2"#) == true)
    }

    @Test func metricsAreInPrometheusTextFormat() {
        let provider = FakeProvider()
        provider.state.withLock { $0.status = FakeProvider.status(name: "default", phase: .fresh, version: 1) }
        let api = admin([provider])
        _ = api.handle(request("/healthz", guarded: false))
        let response = api.handle(request("/metrics", guarded: false)).immediate
        #expect(response?.status == 200)
        #expect(response?.header("Content-Type") == "text/plain; version=0.0.4; charset=utf-8")
        #expect(response?.header("Cache-Control") == "no-store")
        #expect(response?.bodyText.contains(bytes: #"route="/healthz""#) == true)
    }

    @Test func otherPathsAre404AndOtherMethods405() {
        let api = admin([FakeProvider()])
        let missing = api.handle(request("/token", guarded: false)).immediate
        expectError(missing, 404, "not_found")
        #expect(missing?.string("error_description") == "no route for /token")
        for path in ["/healthz", "/readyz", "/metrics"] {
            expectError(
                api.handle(request("POST", path, guarded: false)).immediate, 405, "method_not_allowed",
                headers: ["Allow": "GET, HEAD"])
        }
    }

    /// `POST /reload` is behind the request guard (a browser's cross-site form cannot set the
    /// header), answers only once the reload has ended, and says how it ended.
    @Test func reloadIsAGuardedPostAnsweredWithItsOutcome() {
        let outcomes: [ReloadOutcome] = [
            .reloaded(
                {
                    var summary = ReloadSummary()
                    summary.added = ["new"]
                    summary.changed = ["b"]
                    summary.unchanged = ["a"]
                    return summary
                }()),
            .invalid(problem: "providers[1].source: cannot read /k.pem"),
            .refused(problem: "changing listen needs a restart"),
            .abandoned(problem: "provider \"b\": its replacement got no token within 30 s"),
        ]
        let next = Lock(0)
        let requested = Lock(0)
        let api = AdminAPI(
            providers: [FakeProvider()], metrics: BrokerMetrics(version: "test"),
            reload: { ended in
                requested.withLock { $0 += 1 }
                ended(
                    outcomes[
                        next.withLock { index in
                            defer { index += 1 }
                            return index
                        }])
            })
        expectError(api.handle(request("POST", "/reload", guarded: false)).immediate, 403, "missing_request_header")
        expectError(
            api.handle(request("GET", "/reload")).immediate, 405, "method_not_allowed", headers: ["Allow": "POST"])
        #expect(requested.withLock { $0 } == 0, "a refused request starts no reload")
        var answers: [HTTPResponse] = []
        for _ in outcomes {
            let responder = RecordingResponder()
            #expect(api.handle(request("POST", "/reload")).start(responder), "the answer waits for the reload")
            answers += responder.responses
        }
        #expect(answers.map(\.status) == [200, 422, 409, 503])
        #expect(answers.map(\.errorCode) == [nil, "invalid_configuration", "reload_refused", "reload_abandoned"])
        #expect(answers[0].bool("reloaded") == true)
        #expect(
            answers[0].bodyText.contains(
                bytes: #""added":["new"],"changed":["b"],"removed":[],"unchanged":["a"]"#) == true)
        #expect(answers[1].string("error_description")?.hasSuffix("providers[1].source: cannot read /k.pem") == true)
    }

    @Test func withoutAWayToReloadTheRouteIsNotThere() {
        expectError(admin([FakeProvider()]).handle(request("POST", "/reload")).immediate, 404, "not_found")
    }
}
