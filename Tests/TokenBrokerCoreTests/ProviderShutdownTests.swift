import Testing
import TokenBrokerTestSupport
import TokenBrokerCore

/// A provider's `run()` ends only once its fetch has: the broker awaits the providers' tasks
/// before it exits, and a fetch still running then would use OpenSSL after exit tore it down.
struct ProviderShutdownTests {
    @Test func runEndsAfterTheFetchInFlightNotBefore() async {
        let source = ScriptedSource(gated: true)
        let provider = TokenProvider(configuration: ProviderConfiguration(), source: source, clock: ManualClock(), jitter: .fixed(0.5))
        let order = Lock<[String]>([])
        let service = Task {
            await provider.run()
            order.withLock { $0.append("run ended") }
        }
        #expect(await eventually { source.parkedCount == 1 })
        service.cancel()
        // The fetch (which, like a file read, does not stop when cancelled) ends a moment later.
        let opener = Task {
            try? await Task.sleep(for: .milliseconds(100))
            order.withLock { $0.append("fetch let through") }
            source.open()
        }
        await service.value
        await opener.value
        #expect(order.withLock { $0 } == ["fetch let through", "run ended"])
    }
}
