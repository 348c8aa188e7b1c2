import Glibc
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport
import TokenBrokerUpstream

/// The HTTP client's loops as hosts of other event sources (the token listener's daemons when
/// proxies are configured): a source runs on its loop's thread when its descriptor is readable
/// or when marked pending, `runOnLoop` runs work there and waits for it, and a detached source
/// no longer runs. Each source here is one end of a pipe.
@Suite struct EventLoopHostTests {
    /// A pipe whose reading end is a source's descriptor; its work drains the pipe and counts
    /// its runs, noting the thread it ran on.
    final class PipeSource: Sendable {
        let readEnd: Int32
        let writeEnd: Int32
        let runs = Atomic<Int>(0)
        let bytesRead = Atomic<Int>(0)
        let threads = Lock<Set<UInt>>([])

        init() throws {
            var ends: [Int32] = [-1, -1]
            guard pipe(&ends) == 0 else { throw PipeFailed() }
            // The source drains it until `read` finds nothing.
            _ = fcntl(ends[0], F_SETFL, fcntl(ends[0], F_GETFL) | O_NONBLOCK)
            readEnd = ends[0]
            writeEnd = ends[1]
        }

        func source(on host: any EventLoopHost) -> EventLoopSource {
            EventLoopSource(descriptor: readEnd, host: host, timeoutMilliseconds: { 1000 }, run: drain)
        }

        private func drain() {
            runs.add(1, ordering: .relaxed)
            threads.withLock { _ = $0.insert(UInt(pthread_self())) }
            var buffer = [UInt8](repeating: 0, count: 64)
            while true {
                let count = read(readEnd, &buffer, buffer.count)
                guard count > 0 else { break }
                bytesRead.add(count, ordering: .relaxed)
            }
        }

        func write(_ count: Int) {
            let bytes = [UInt8](repeating: 1, count: count)
            _ = Glibc.write(writeEnd, bytes, count)
        }

        deinit {
            close(readEnd)
            close(writeEnd)
        }
    }

    struct PipeFailed: Error {}
    struct NoLoops: Error {}

    private func host() throws -> any EventLoopHost {
        if let failure = UpstreamHTTPClient.shared.startProxyLoops() { throw LoopFailure(reason: failure) }
        guard let host = UpstreamHTTPClient.shared.eventLoops.last else { throw NoLoops() }
        return host
    }

    struct LoopFailure: Error { let reason: String }

    @Test func aSourceRunsOnItsLoopsThreadWhenReadableAndNotOnceDetached() async throws {
        let host = try host()
        let pipe = try PipeSource()
        let source = pipe.source(on: host)
        host.attach(source)

        pipe.write(3)
        #expect(await eventually { pipe.bytesRead.load(ordering: .relaxed) == 3 })
        pipe.write(5)
        #expect(await eventually { pipe.bytesRead.load(ordering: .relaxed) == 8 })
        let loopThread = Lock<UInt>(0)
        host.runOnLoop { loopThread.withLock { $0 = UInt(pthread_self()) } }
        #expect(pipe.threads.withLock { $0 } == [loopThread.withLock { $0 }], "every run on the loop's thread")
        #expect(loopThread.withLock { $0 } != UInt(pthread_self()))

        host.runOnLoop { host.detach(source) }
        let runs = pipe.runs.load(ordering: .relaxed)
        pipe.write(2)
        // Readable for 1.5 s and more than one of its timeouts: a source still attached would
        // have run and drained it.
        try await Task.sleep(for: .milliseconds(1500))
        #expect(pipe.runs.load(ordering: .relaxed) == runs)
        #expect(pipe.bytesRead.load(ordering: .relaxed) == 8)
    }

    /// A pending mark runs a source whose descriptor stays quiet, without waiting for its
    /// timeout (a second): twenty marks, each waited for, well within ten seconds.
    @Test func markPendingRunsAQuietSourceAtOnce() async throws {
        let host = try host()
        let pipe = try PipeSource()
        let source = pipe.source(on: host)
        host.attach(source)
        defer { host.runOnLoop { host.detach(source) } }
        #expect(await eventually { pipe.runs.load(ordering: .relaxed) >= 1 }, "a new source runs once at first")

        let clock = ContinuousClock()
        let end = clock.now.advanced(by: .seconds(10))
        var marked = 0
        while marked < 20, clock.now < end {
            let before = pipe.runs.load(ordering: .relaxed)
            source.markPending()
            while pipe.runs.load(ordering: .relaxed) == before, clock.now < end {
                try await Task.sleep(for: .milliseconds(1))
            }
            marked += 1
        }
        #expect(clock.now < end, "20 pending marks took more than 10 s: runs waited for the timeout")
        #expect(pipe.bytesRead.load(ordering: .relaxed) == 0)
    }

    @Test func runOnLoopReturnsAfterTheWorkRanAndRunsAtOnceOnTheLoopsOwnThread() throws {
        let host = try host()
        let order = Lock<[String]>([])
        host.runOnLoop {
            order.withLock { $0.append("outer") }
            // On the loop's own thread: at once, not queued behind the work that is running.
            host.runOnLoop { order.withLock { $0.append("inner") } }
            order.withLock { $0.append("outer end") }
        }
        order.withLock { $0.append("returned") }
        #expect(order.withLock { $0 } == ["outer", "inner", "outer end", "returned"])
    }
}
