import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

/// The metrics text: the provider-state gauge names each phase as `/readyz` does, and counters
/// keep their two labels apart.
@Suite struct BrokerMetricsTests {
    /// One line of the rendered text per phase, 1 for the provider's phase and 0 for the others.
    private func stateLines(_ text: String, provider: String) -> [String: String] {
        var lines: [String: String] = [:]
        for line in text.split(separator: "\n")
        where line.hasPrefix("token_broker_provider_state{provider=\"\(provider)\",state=\"") {
            let afterState = line.split(separator: "state=\"", maxSplits: 1)[1]
            let parts = afterState.split(separator: "\"} ", maxSplits: 1)
            lines[String(parts[0])] = String(parts[1])
        }
        return lines
    }

    @Test func theStateGaugeNamesEveryPhaseAndMarksTheCurrentOne() async {
        #expect(ProviderPhase.allCases.map(\.rawValue) == ["fresh", "refreshing", "backing_off", "paused", "expired"])
        let provider = TokenProvider(
            configuration: ProviderConfiguration(name: "p"), source: ScriptedSource(), clock: ManualClock(),
            jitter: .fixed(0.5))
        let metrics = BrokerMetrics(version: "test")
        #expect(provider.status().phase == .expired, "no token before the first fetch")
        #expect(
            stateLines(metrics.render(statuses: [provider.status()]), provider: "p")
                == ["fresh": "0", "refreshing": "0", "backing_off": "0", "paused": "0", "expired": "1"])
        let service = Task { await provider.run() }
        defer { service.cancel() }
        #expect(await eventually { provider.status().phase == .fresh })
        #expect(
            stateLines(metrics.render(statuses: [provider.status()]), provider: "p")
                == ["fresh": "1", "refreshing": "0", "backing_off": "0", "paused": "0", "expired": "0"])
    }

    @Test func twoLabelCountersKeepOwnerAndValueApart() {
        let metrics = BrokerMetrics(version: "test")
        metrics.recordFetch(provider: "p", error: nil, duration: .milliseconds(20))
        metrics.recordFetch(provider: "p", error: .timeout("slow"), duration: .seconds(2))
        metrics.recordProxied(proxy: "orders", status: 502)
        metrics.recordRequest(listener: "token", route: "/token", status: 200)
        let text = metrics.render(statuses: [])
        #expect(text.contains("token_broker_refreshes_total{provider=\"p\",result=\"success\"} 1\n"))
        #expect(text.contains("token_broker_refreshes_total{provider=\"p\",result=\"timeout\"} 1\n"))
        #expect(text.contains("token_broker_proxy_requests_total{proxy=\"orders\",code=\"502\"} 1\n"))
        #expect(text.contains("token_broker_http_requests_total{listener=\"token\",route=\"/token\",code=\"200\"} 1\n"))
        #expect(text.contains("token_broker_refresh_duration_seconds_sum{provider=\"p\"} 2.02\n"))
    }

    /// Each listener's waiting requests, and the waits refused by its cap, read at scrape time;
    /// the key's refusals, recorded, from 0 where callers have keys.
    @Test func waitingRequestsAndRefusedWaitsAreShownByListenerAndLimit() {
        let metrics = BrokerMetrics(version: "test")
        metrics.observeWaiting(listener: "token", callerKeys: true) { (14, 3) }
        metrics.observeWaiting(listener: "admin") { (0, 0) }
        var text = metrics.render(statuses: [])
        #expect(text.contains("# TYPE token_broker_waiting_requests gauge\n"))
        #expect(text.contains("token_broker_waiting_requests{listener=\"token\"} 14\n"))
        #expect(text.contains("token_broker_waiting_requests{listener=\"admin\"} 0\n"))
        #expect(text.contains("# TYPE token_broker_waits_refused_total counter\n"))
        #expect(text.contains("token_broker_waits_refused_total{listener=\"token\",limit=\"listener\"} 3\n"))
        #expect(text.contains("token_broker_waits_refused_total{listener=\"token\",limit=\"caller_key\"} 0\n"))
        #expect(!text.contains("token_broker_waits_refused_total{listener=\"admin\",limit=\"caller_key\"}"))
        metrics.recordWaitRefused(listener: "token", limit: .callerKey)
        metrics.recordWaitRefused(listener: "token", limit: .callerKey)
        metrics.recordWaitRefused(listener: "token", limit: .listener)  // read from the listener, not counted here
        text = metrics.render(statuses: [])
        #expect(text.contains("token_broker_waits_refused_total{listener=\"token\",limit=\"caller_key\"} 2\n"))
        #expect(text.contains("token_broker_waits_refused_total{listener=\"token\",limit=\"listener\"} 3\n"))
    }

    @Test func templatesAreOneSeriesEachWithTheirChildrenCountedUnderTheTemplatesName() async {
        var configuration = ProviderConfiguration(name: "orders")
        configuration.perRequest = [.audience]
        configuration.allowedAudiences = [AllowPattern("https://*")!]
        let clock = ManualClock()
        let source = ScriptedSource(gated: true)
        let settings = configuration
        let template = ProviderTemplate(
            configuration: settings, clock: clock,
            makeChild: { _, _ in TokenProvider(configuration: settings, source: source, clock: clock) },
            attach: { _ in () })
        let service = Task { await template.run() }
        defer { service.cancel() }
        var children: [TokenProvider<ManualClock>] = []
        for name in ["a", "b", "c"] {
            guard case .success(let made) = template.child(for: TokenRequestValues(audience: "https://\(name).example"))
            else {
                Issue.record("no child")
                return
            }
            children.append(made.held.child)
        }
        let waiter = Task { await children[0].onTokenReady(timeout: .seconds(60)) }
        #expect(await eventually { template.status().waiters == 1 })
        let metrics = BrokerMetrics(version: "test")
        metrics.recordChildRefused(template: "orders")
        metrics.recordChildDropped(template: "orders")
        metrics.recordChildDropped(template: "orders")
        metrics.recordSinkWrite(provider: "default", succeeded: true)
        metrics.recordSinkWrite(provider: "default", succeeded: true)
        metrics.recordSinkWrite(provider: "default", succeeded: false)
        let waiting = metrics.render(statuses: [], templates: [template.status()])
        #expect(waiting.contains("token_broker_template_children{provider=\"orders\"} 3\n"))
        #expect(waiting.contains("token_broker_template_children_ready{provider=\"orders\"} 0\n"))
        #expect(waiting.contains("token_broker_longpoll_waiters{provider=\"orders\"} 1\n"))
        #expect(waiting.contains("token_broker_template_children_refused_total{provider=\"orders\"} 1\n"))
        #expect(waiting.contains("token_broker_template_children_dropped_total{provider=\"orders\"} 2\n"))
        #expect(waiting.contains("token_broker_sink_writes_total{provider=\"default\",result=\"error\"} 1\n"))
        #expect(waiting.contains("token_broker_sink_writes_total{provider=\"default\",result=\"ok\"} 2\n"))
        #expect(waiting.contains("# TYPE token_broker_template_children gauge\n"))
        #expect(waiting.contains("# TYPE token_broker_sink_writes_total counter\n"))
        source.open()
        _ = await waiter.value
        #expect(await eventually { template.status().ready == 3 })
        let ready = metrics.render(statuses: [], templates: [template.status()])
        #expect(ready.contains("token_broker_template_children_ready{provider=\"orders\"} 3\n"))
        #expect(ready.contains("token_broker_longpoll_waiters{provider=\"orders\"} 0\n"))
        // No requested value is ever a label, and no child has a series of its own.
        #expect(!ready.contains("example"))
        #expect(!ready.contains("token_broker_provider_state{provider=\"orders\""))
        #expect(ready.split(separator: "\n").filter { $0.hasPrefix("token_broker_template_children{") }.count == 1)
    }
}
