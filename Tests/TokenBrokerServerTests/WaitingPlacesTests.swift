import Synchronization
import Testing
import TokenBrokerCore

@testable import TokenBrokerServer

/// `WaitingPlaces` alone: the cap, and its count under threads that take and give back at once.
/// (`HTTPServerTests` covers the ways a real wait ends.)
@Suite struct WaitingPlacesTests {
    @Test func sevenEighthsOfTheConnectionLimitMayWait() throws {
        #expect(WaitingPlaces.limit(connectionLimit: 16_000) == 14_000)
        #expect(WaitingPlaces.limit(connectionLimit: 16) == 14)
        #expect(WaitingPlaces.limit(connectionLimit: 17) == 14)
        #expect(WaitingPlaces.limit(connectionLimit: 1_000_000) == 875_000)
        #expect(WaitingPlaces.limit(connectionLimit: 1) == 1)
        var configuration = HTTPServer.Configuration(address: try ListenAddress(parsing: "127.0.0.1:0"))
        configuration.connectionLimit = 256
        #expect(configuration.waitingLimit == 224)
    }

    @Test func placesAreTakenUpToTheLimitThenRefusedAndCountedUntilOneIsGivenBack() {
        let places = WaitingPlaces(connectionLimit: 16)
        for _ in 0..<14 { #expect(places.take()) }
        #expect(!places.take() && !places.take())
        #expect(places.count == 14 && places.refused == 2)
        places.giveBack()
        #expect(places.count == 13)
        #expect(places.take())
        #expect(!places.take())
        #expect(places.count == 14 && places.refused == 3)
    }

    /// Threads taking at once get exactly `limit` places between them; the refused ones never
    /// push the count past it, and giving every place back leaves 0.
    @Test func concurrentTakesGetExactlyTheLimitAndTheCountNeverPassesIt() async {
        let places = WaitingPlaces(connectionLimit: 800)
        let tally = Tally()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<500 {
                        guard places.take() else { continue }
                        tally.taken.add(1, ordering: .relaxed)
                        _ = tally.highest.max(places.count, ordering: .relaxed)
                    }
                }
            }
        }
        #expect(tally.taken.load(ordering: .relaxed) == 700 && places.count == 700)
        #expect(places.refused == 8 * 500 - 700)
        #expect(tally.highest.load(ordering: .relaxed) <= 700)

        // Taking and giving back at once, from every thread: the count stays within the limit and ends at 0.
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<8 {
                group.addTask {
                    for _ in 0..<20_000 {
                        if index < 4 {
                            if places.take() { places.giveBack() }
                        } else if places.take() {
                            _ = tally.highest.max(places.count, ordering: .relaxed)
                            places.giveBack()
                        }
                    }
                }
            }
            for _ in 0..<700 { places.giveBack() }
        }
        #expect(places.count == 0)
        #expect(tally.highest.load(ordering: .relaxed) <= 700)
    }
}

/// Counters the tasks share.
private final class Tally: Sendable {
    let taken = Atomic<Int>(0)
    let highest = Atomic<Int>(0)
}
