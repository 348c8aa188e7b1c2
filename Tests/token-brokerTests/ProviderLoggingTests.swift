import Testing
import TokenBrokerCore

@testable import token_broker

/// The provider's events as the broker wires them: each fetch counted in the metrics (and logged).
@Suite struct ProviderLoggingTests {
    private func lines(_ metrics: BrokerMetrics, _ name: String) -> [String] {
        metrics.render(statuses: []).split(separator: "\n").map(String.init).filter { $0.hasPrefix(name + "{") }
    }

    @Test func aFetchIsCountedWithItsResultAndTheIssuersStatus() {
        let metrics = BrokerMetrics(version: "test")
        let events = ProviderEvents.logged(recordingIn: metrics)
        let token = FetchedToken(accessToken: "secret-value", lifetime: .milliseconds(59_600), upstreamStatus: 200)
        events.fetched("api", .success((token, 3)), .milliseconds(1_234))
        events.fetched("api", .failure(.timeout("the issuer did not answer")), .seconds(5))
        events.fetched("local", .success((FetchedToken(accessToken: "t", lifetime: nil), 1)), .zero)
        #expect(lines(metrics, "token_broker_refreshes_total").count == 3)
        #expect(
            lines(metrics, "token_broker_upstream_responses_total") == [
                #"token_broker_upstream_responses_total{provider="api",code="200"} 1"#
            ])
    }

    @Test func aChildsFetchesAreCountedUnderItsTemplatesNameAlone() {
        let metrics = BrokerMetrics(version: "test")
        let events = ProviderEvents.logged(
            recordingIn: metrics, child: TokenRequestValues(audience: "https://orders.example"))
        events.fetched(
            "orders", .success((FetchedToken(accessToken: "t", lifetime: nil, upstreamStatus: 200), 1)), .zero)
        events.fetched("orders", .failure(.unreachable("refused")), .zero)
        #expect(
            lines(metrics, "token_broker_refreshes_total") == [
                #"token_broker_refreshes_total{provider="orders",result="success"} 1"#,
                #"token_broker_refreshes_total{provider="orders",result="unreachable"} 1"#,
            ])
        #expect(!metrics.render(statuses: []).contains("orders.example"))
    }

    @Test func aTemplatesDropsAndRefusalsAreCountedUnderItsName() {
        let metrics = BrokerMetrics(version: "test")
        let events = TemplateEvents.logged(recordingIn: metrics)
        let values = TokenRequestValues(audience: "https://orders.example")
        events.made("orders", values)
        events.dropped("orders", values)
        events.refused("orders", values)
        events.refused("orders", TokenRequestValues(audience: "https://other.example"))
        #expect(
            lines(metrics, "token_broker_template_children_dropped_total") == [
                #"token_broker_template_children_dropped_total{provider="orders"} 1"#
            ])
        #expect(
            lines(metrics, "token_broker_template_children_refused_total") == [
                #"token_broker_template_children_refused_total{provider="orders"} 2"#
            ])
    }

    @Test func aKeyedThrottleHoldsBackEachKeysEventsApart() {
        // A client flooding one provider's refusals must not hide another provider's.
        let throttle = KeyedLogThrottle(interval: .seconds(1))
        let start = ContinuousClock.now
        #expect(throttle.admit("a", at: start) == 0)
        #expect(throttle.admit("a", at: start.advanced(by: .milliseconds(10))) == nil)
        #expect(throttle.admit("b", at: start.advanced(by: .milliseconds(20))) == 0)
        #expect(throttle.admit("a", at: start.advanced(by: .seconds(2))) == 1)
    }

    @Test func theRefusalLogLetsOneLineThroughPerIntervalAndCountsTheOthers() {
        let throttle = LogThrottle(interval: .seconds(1))
        let start = ContinuousClock.now
        #expect(throttle.admit(at: start) == 0)
        #expect(throttle.admit(at: start.advanced(by: .milliseconds(999))) == nil)
        #expect(throttle.admit(at: start.advanced(by: .milliseconds(999))) == nil)
        // The next line let through says how many were held back since the last.
        #expect(throttle.admit(at: start.advanced(by: .seconds(1))) == 2)
        #expect(throttle.admit(at: start.advanced(by: .milliseconds(1500))) == nil)
        #expect(throttle.admit(at: start.advanced(by: .seconds(3))) == 1)
    }
}
