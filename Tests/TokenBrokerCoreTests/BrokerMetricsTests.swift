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
}
