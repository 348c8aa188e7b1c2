import Dispatch
import Synchronization
import Testing
import TokenBrokerTestSupport

@testable import TokenBrokerStore

/// The store's queue of calls: a call is answered by its deadline, its wait included; a caller
/// that gives up takes its call off; background work waits for every call.
@Suite struct RedisCallQueueTests {
    /// What happened, in order, with the turn each call got.
    private final class Journal: Sendable {
        let entries = Mutex<[String]>([])
        func note(_ entry: String) { entries.withLock { $0.append(entry) } }
        var all: [String] { entries.withLock { $0 } }
    }

    private static func after(milliseconds: Int) -> ContinuousClock.Instant {
        ContinuousClock.now.advanced(by: .milliseconds(milliseconds))
    }

    /// The queue is held by background work for 600 ms; a call asked meanwhile with 100 ms is
    /// answered `late` at its deadline, while the work still runs, and never runs.
    @Test func aCallWhoseDeadlinePassesWhileItWaitsIsAnsweredLateAtItsDeadline() async throws {
        let queue = RedisCallQueue(label: "test")
        let journal = Journal()
        let release = DispatchSemaphore(value: 0)
        queue.background {
            journal.note("work started")
            _ = release.wait(timeout: .now() + .seconds(20))
            journal.note("work ended")
        }
        #expect(await eventually(within: 20) { journal.all == ["work started"] })
        queue.enqueue(queue.nextID(), by: Self.after(milliseconds: 100)) { turn in journal.note("call \(turn)") }
        #expect(await eventually(within: 20) { journal.all.count == 2 })
        release.signal()
        queue.sync {}
        #expect(journal.all == ["work started", "call late", "work ended"])
    }

    /// A caller that gives up while its call waits has it answered `givenUp` at once, and it never
    /// runs; a call asked from a task already cancelled is never queued.
    @Test func aCallGivenUpWhileItWaitsNeverRuns() async throws {
        let queue = RedisCallQueue(label: "test")
        let journal = Journal()
        let release = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        // The queue is busy with this work before the call is asked: otherwise its turn could come
        // first (calls go before background work), and it would run before it is given up.
        queue.background {
            started.signal()
            _ = release.wait(timeout: .now() + .seconds(20))
        }
        #expect(started.wait(timeout: .now() + .seconds(20)) == .success)
        let id = queue.nextID()
        queue.enqueue(id, by: Self.after(milliseconds: 20_000)) { turn in journal.note("first \(turn)") }
        queue.cancel(id)
        #expect(journal.all == ["first givenUp"])
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            queue.enqueue(queue.nextID(), by: Self.after(milliseconds: 20_000)) { turn in journal.note("second \(turn)")
            }
        }
        await cancelled.value
        release.signal()
        queue.sync {}
        #expect(journal.all == ["first givenUp", "second givenUp"])
    }

    /// Calls have their turns first asked first, each before any background work queued.
    @Test func callsRunInTurnBeforeBackgroundWork() async throws {
        let queue = RedisCallQueue(label: "test")
        let journal = Journal()
        let release = DispatchSemaphore(value: 0)
        queue.background { _ = release.wait(timeout: .now() + .seconds(20)) }
        queue.background { journal.note("work") }
        for name in ["a", "b", "c"] {
            queue.enqueue(queue.nextID(), by: Self.after(milliseconds: 20_000)) { turn in
                journal.note("\(name) \(turn)")
            }
        }
        release.signal()
        queue.sync {}
        #expect(journal.all == ["a run", "b run", "c run", "work"])
    }
}

/// The lookup of the Redis host's name: bounded by the call's deadline, made once however many
/// attempts wait for it, its answer kept for the attempts that follow.
@Suite struct RedisHostResolverTests {
    @Test(arguments: ["127.0.0.1", "::1", "10.0.0.5", "fe80::1"])
    func anAddressNeedsNoLookup(_ host: String) throws {
        let resolver = RedisHostResolver(host: host) { _ in .failure(RedisFailure("looked up")) }
        #expect(try resolver.addresses(by: .now, timeoutMsec: 10) == [host])
    }

    @Test func localhostIsLookedUpWithTheSystemsResolver() throws {
        let addresses = try RedisHostResolver.systemLookUp("localhost").get()
        #expect(addresses.contains("127.0.0.1") || addresses.contains("::1"), "\(addresses)")
    }

    /// A DNS server that does not answer: each attempt gives up at its deadline; the attempts
    /// while the lookup is under way wait for it rather than start another; once it answers, its
    /// answer serves the next attempts; forgotten, the name is looked up again.
    @Test func aSlowLookupIsGivenUpAtTheDeadlineMadeOnceAndItsAnswerKept() async throws {
        let lookups = Atomic<Int>(0)
        let answer = DispatchSemaphore(value: 0)
        let resolver = RedisHostResolver(host: "redis.example") { _ in
            lookups.add(1, ordering: .relaxed)
            _ = answer.wait(timeout: .now() + .seconds(20))
            return .success(["192.0.2.7"])
        }
        for _ in 0..<3 {
            #expect {
                try resolver.addresses(by: .now.advanced(by: .milliseconds(100)), timeoutMsec: 100)
            } throws: { error in
                (error as? RedisFailure)?.timedOut == true
                    && "\(error)" == "looking up redis.example took longer than 100 ms"
            }
        }
        #expect(lookups.load(ordering: .relaxed) == 1)
        answer.signal()
        #expect(try resolver.addresses(by: .now.advanced(by: .seconds(20)), timeoutMsec: 20_000) == ["192.0.2.7"])
        #expect(try resolver.addresses(by: .now.advanced(by: .seconds(20)), timeoutMsec: 20_000) == ["192.0.2.7"])
        #expect(lookups.load(ordering: .relaxed) == 1)
        resolver.forget()
        answer.signal()
        #expect(try resolver.addresses(by: .now.advanced(by: .seconds(20)), timeoutMsec: 20_000) == ["192.0.2.7"])
        #expect(lookups.load(ordering: .relaxed) == 2)
    }
}
