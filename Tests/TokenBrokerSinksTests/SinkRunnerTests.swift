import Foundation
import Glibc
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSinks
import TokenBrokerTestSupport

/// The sink runner against a real `TokenProvider` on a manual clock: time moves only when a test
/// says, and each test waits (with a generous bound) for the runner's hand-offs between steps.
@Suite(.timeLimit(.minutes(2))) struct SinkRunnerTests {
    /// A provider named `p` refreshing every `refreshDelay` seconds, pausing when idle.
    private func provider(_ source: ScriptedSource, _ clock: ManualClock, refreshDelay: Int = 10)
        -> TokenProvider<ManualClock>
    {
        TokenProvider(
            configuration: ProviderConfiguration(name: "p", tokenRefreshDelaySec: refreshDelay), source: source,
            clock: clock, jitter: .fixed(0.5))
    }

    /// What most tests run: provider `p` (a token every 10 s from a scripted source, on a manual
    /// clock) and a runner writing it to `p.token` with `mode` in a private directory, its writes
    /// recorded.
    private struct Setup {
        let directory: TemporaryDirectory
        let path: String
        let clock = ManualClock()
        let source = ScriptedSource()
        let provider: TokenProvider<ManualClock>
        let writes = Recorder()
        let runner: SinkRunner<ManualClock>

        init(mode: UInt32 = SinkConfiguration.defaultMode) throws {
            directory = try privateDirectory()
            path = directory.path("p.token")
            provider = TokenProvider(
                configuration: ProviderConfiguration(name: "p", tokenRefreshDelaySec: 10), source: source,
                clock: clock, jitter: .fixed(0.5))
            runner = try SinkRunner(
                configuration: SinkConfiguration(provider: "p", path: path, mode: mode), provider: provider,
                events: writes.events)
        }
    }

    /// Runs the provider, and the runner when given, in tasks of their own for the length of `body`.
    private func running(
        _ provider: TokenProvider<ManualClock>, _ runner: SinkRunner<ManualClock>?, _ body: () async throws -> Void
    ) async rethrows {
        let service = Task { await provider.run() }
        let sink = runner.map { runner in Task { await runner.run() } }
        defer {
            sink?.cancel()
            service.cancel()
        }
        try await body()
    }

    /// Moves the clock a second at a time, `seconds` times, each time waiting until the provider
    /// has settled (no fetch in flight, and its timer armed again unless it paused) and, with a
    /// runner, until the runner waits again (its hand-offs done).
    private func step(
        _ clock: ManualClock, seconds: Int, _ provider: TokenProvider<ManualClock>, runnerWaits: Bool
    ) async {
        for _ in 0..<seconds {
            clock.advance(by: .seconds(1))
            let settled = await eventually {
                let status = provider.status()
                guard status.phase != .paused else { return true }
                return status.phase != .refreshing && clock.sleeperCount > 0 && (!runnerWaits || status.waiters == 1)
            }
            #expect(settled, "the provider and the runner settle after each step")
        }
    }

    @Test func eachNewVersionIsWrittenAndReportedByItsFingerprint() async throws {
        let setup = try Setup(mode: 0o640)
        let (path, clock, source, provider, writes, runner) = (
            setup.path, setup.clock, setup.source, setup.provider, setup.writes, setup.runner
        )
        await running(provider, runner) {
            #expect(await eventually { contents(path) == "token-1" })
            #expect(modeBits(path) == 0o640)
            clock.advance(by: .seconds(10))
            #expect(await eventually { contents(path) == "token-2" })
            #expect(await eventually { runner.status().writes == 2 })
            // The status is updated before the write is reported (events come after each write).
            #expect(await eventually { writes.all.count == 2 })
        }
        let status = runner.status()
        #expect(status.version == 2)
        #expect(status.fingerprint == Fingerprint.of("token-2"))
        #expect(status.failures == 0 && status.lastError == nil)
        #expect(status.holdsValidToken)
        #expect(writes.all.map(\.version) == [1, 2])
        #expect(writes.all.map(\.fingerprint) == [Fingerprint.of("token-1"), Fingerprint.of("token-2")])
        #expect(writes.all.allSatisfy { $0.error == nil && !$0.isRetry && !$0.fingerprint.contains("token-") })
        #expect(source.fetchCount == 2, "the sink only waits: it starts no fetch of its own")
    }

    @Test func theFileKeepsTheLastGoodTokenWhileRefreshFailsAndAfterItExpires() async throws {
        let directory = try privateDirectory()
        let path = directory.path("p.token")
        let clock = ManualClock()
        let source = ScriptedSource([.token(lifetime: .seconds(60)), .failure(.unreachable("issuer down"))])
        let provider = provider(source, clock, refreshDelay: 30)
        let runner = try SinkRunner(configuration: SinkConfiguration(provider: "p", path: path), provider: provider)
        await running(provider, runner) {
            #expect(await eventually { contents(path) == "token-1" && provider.status().waiters == 1 })
            await step(clock, seconds: 59, provider, runnerWaits: true)
            #expect(source.fetchCount > 2, "refresh failed and was retried")
            #expect(contents(path) == "token-1")
            #expect(runner.status().holdsValidToken)

            await step(clock, seconds: 5, provider, runnerWaits: true)
            #expect(provider.status().version == nil, "the token has expired")
            #expect(contents(path) == "token-1", "the file is left as it is")
            #expect(modeBits(path) == 0o600)
            #expect(!runner.status().holdsValidToken)
            #expect(runner.status().version == 1)

            source.script([.token(lifetime: .seconds(900))])
            await step(clock, seconds: 6, provider, runnerWaits: true)
            #expect(await eventually { runner.status().version == 2 })
            #expect(contents(path) == "token-\(source.fetchCount)")
            #expect(runner.status().holdsValidToken)
        }
        #expect(runner.status().writes == 2 && runner.status().failures == 0)
    }

    @Test func theJSONFormatIsTheTokenBody() async throws {
        let directory = try privateDirectory()
        let path = directory.path("p.json")
        let (clock, source) = (ManualClock(), ScriptedSource())
        let provider = provider(source, clock)
        let runner = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: path, format: .json), provider: provider)
        await running(provider, runner) {
            #expect(await eventually { runner.status().writes == 1 })
        }
        let data = try #require(FileManager.default.contents(atPath: path))
        let body = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(body["access_token"] as? String == "token-1")
        #expect(body["token_type"] as? String == "Bearer")
        #expect(body["version"] as? Int == 1)
        #expect(body["provider"] as? String == "p")
        #expect(body["stale"] as? Bool == false)
        #expect(body["expires_in"] == nil, "a number that would go stale in the file: the reader reads expires_at")
        #expect(body["expires_at"] is String && body["issued_at"] is String)
        #expect(data.last == UInt8(ascii: "}"), "nothing after the body")
    }

    @Test func leftoverTemporaryFilesAreRemovedAtStartAndTheFirstWriteSucceeds() async throws {
        let directory = try privateDirectory()
        let path = directory.path("p.token")
        // As a restart with the same process number leaves them (PID 1 in a container): more
        // than a write tries names for.
        let leftovers = (1...20).map { directory.path(".p.token.tmp-\(getpid())-\($0)") }
        for leftover in leftovers {
            #expect(FileManager.default.createFile(atPath: leftover, contents: Data("x".utf8)))
        }
        let older = directory.path(".p.token.tmp-1-7")
        #expect(FileManager.default.createFile(atPath: older, contents: Data("x".utf8)))
        // Left alone: a link (never followed), a directory, another file's leftover, a look-alike.
        let victim = directory.path("victim")
        try "victim's own".write(toFile: victim, atomically: false, encoding: .utf8)
        let link = directory.path(".p.token.tmp-\(getpid())-21")
        #expect(symlink(victim, link) == 0)
        let folder = directory.path(".p.token.tmp-\(getpid())-22")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        let others = [
            directory.path(".q.token.tmp-1-1"), directory.path(".p.token.tmp-x-1"), directory.path("p.token.tmp-1-1"),
        ]
        for other in others { #expect(FileManager.default.createFile(atPath: other, contents: Data("x".utf8))) }

        let (clock, source) = (ManualClock(), ScriptedSource())
        let provider = provider(source, clock)
        let cleanups = Lock<[SinkEvents.Cleanup]>([])
        let runner = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: path), provider: provider,
            events: SinkEvents(cleanedUp: { cleanup in cleanups.withLock { $0.append(cleanup) } }))
        await running(provider, runner) {
            #expect(await eventually { contents(path) == "token-1" }, "the first write succeeds")
        }
        #expect(runner.status().failures == 0)
        #expect(cleanups.withLock { $0.map(\.removed) } == [21], "reported once, with the count")
        #expect(cleanups.withLock { $0.first?.error } == nil)
        #expect((leftovers + [older]).allSatisfy { modeBits($0) == nil }, "the leftovers are gone")
        #expect(contents(victim) == "victim's own" && modeBits(link) != nil, "the link is neither followed nor removed")
        #expect(modeBits(folder) != nil && others.allSatisfy { modeBits($0) != nil })
    }

    @Test func aFailedWriteIsReportedAndTriedAgainWithTheSameToken() async throws {
        let directory = try privateDirectory()
        let path = directory.path("p.token")
        let undo = try makeReadOnly(directory.url.path)
        let (clock, source) = (ManualClock(), ScriptedSource())
        let provider = provider(source, clock, refreshDelay: 300)
        let writes = Recorder()
        let runner = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: path), provider: provider, events: writes.events,
            retryDelay: .seconds(3))
        try await running(provider, runner) {
            #expect(await eventually { writes.all.count == 1 && provider.status().waiters == 1 })
            let failure = try? #require(writes.all.first?.error)
            #expect(failure?.call == "open")
            #expect([EACCES, EPERM].contains(failure?.code ?? 0), "\(String(describing: failure))")
            #expect(runner.status().failures == 1)
            #expect(runner.status().lastError == failure)
            #expect(runner.status().version == nil && !runner.status().holdsValidToken)

            try undo()
            clock.advance(by: .seconds(3))
            #expect(await eventually { contents(path) == "token-1" })
            #expect(await eventually { runner.status().writes == 1 })
            #expect(await eventually { writes.all.count == 2 }, "the retry's write is reported after the status")
        }
        #expect(writes.all.count == 2)
        #expect(writes.all.last?.isRetry == true && writes.all.last?.error == nil)
        #expect(writes.all.last?.version == 1)
        #expect(runner.status().lastError == nil && runner.status().failures == 1)
        #expect(source.fetchCount == 1, "the retry writes the token it has; it fetches none")
    }

    @Test func aFileRemovedOrReplacedBetweenWritesIsReportedThenWrittenAgainAtTheNextLook() async throws {
        // A token every 10 s; the runner looks again every 5 s (half the refresh delay).
        let setup = try Setup()
        let (directory, path, clock, source, provider, writes, runner) = (
            setup.directory, setup.path, setup.clock, setup.source, setup.provider, setup.writes, setup.runner
        )
        try await running(provider, runner) {
            #expect(await eventually { contents(path) == "token-1" && provider.status().waiters == 1 })
            #expect(runner.status().problem == nil)
            // Another writer of the directory removes the file.
            #expect(unlink(path) == 0)
            #expect(runner.status().fileProblem?.contains("was removed since the broker wrote it") == true)
            #expect(runner.status().problem == runner.status().fileProblem)
            #expect(runner.status().holdsValidToken, "the token written is still valid: the file is what is wrong")
            await step(clock, seconds: 5, provider, runnerWaits: true)
            #expect(await eventually { contents(path) == "token-1" }, "written again with the token held")
            #expect(await eventually { writes.all.count == 2 })
            #expect(runner.status().problem == nil)
            // At 10 s the next token is written as usual; then the other writer puts a file of its own in its place.
            await step(clock, seconds: 5, provider, runnerWaits: true)
            #expect(await eventually { contents(path) == "token-2" && writes.all.count == 3 })
            try "theirs".write(toFile: directory.path("theirs"), atomically: false, encoding: .utf8)
            #expect(rename(directory.path("theirs"), path) == 0)
            #expect(runner.status().fileProblem?.contains("was replaced since the broker wrote it") == true)
            await step(clock, seconds: 4, provider, runnerWaits: true)
            #expect(contents(path) == "theirs" && runner.status().problem != nil, "until the next look")
            await step(clock, seconds: 1, provider, runnerWaits: true)
            #expect(await eventually { contents(path) == "token-2" })
            #expect(await eventually { writes.all.count == 4 })
            #expect(runner.status().problem == nil)
        }
        #expect(writes.all.map(\.isRestore) == [false, true, false, true])
        #expect(writes.all.map(\.version) == [1, 1, 2, 2])
        #expect(writes.all.allSatisfy { $0.error == nil })
        #expect(source.fetchCount == 2, "written again from the token held, with no fetch of its own")
        #expect(runner.status().writes == 4 && runner.status().failures == 0)
    }

    @Test func anotherWritersCopyIsLeftAsItIsAndAFileChangedInPlaceIsWrittenAgainAtTheNextLook() async throws {
        // A token every 10 s; the runner looks again every 5 s (half the refresh delay).
        let setup = try Setup(mode: 0o660)
        let (path, clock, source, provider, writes, runner) = (
            setup.path, setup.clock, setup.source, setup.provider, setup.writes, setup.runner
        )
        // Another writer of the same file (a second broker sharing the token through a store).
        let other = try AtomicFileWriter(path: path, mode: 0o660)
        try await running(provider, runner) {
            #expect(await eventually { contents(path) == "token-1" && provider.status().waiters == 1 })
            #expect(other.write(Array("token-1".utf8)).failed == nil)
            #expect(runner.status().problem == nil, "the other's file holds what the runner wrote")
            await step(clock, seconds: 5, provider, runnerWaits: true)
            #expect(writes.all.count == 1, "nothing to write again at the look")
            await step(clock, seconds: 5, provider, runnerWaits: true)
            #expect(await eventually { contents(path) == "token-2" && writes.all.count == 2 })

            // A member of the file's group rewrites it in place.
            let handle = try #require(FileHandle(forWritingAtPath: path))
            try handle.truncate(atOffset: 0)
            try handle.write(contentsOf: Data("attacker".utf8))
            try handle.close()
            #expect(runner.status().fileProblem?.contains("was changed in place since the broker wrote it") == true)
            #expect(runner.status().problem == runner.status().fileProblem)
            await step(clock, seconds: 4, provider, runnerWaits: true)
            #expect(contents(path) == "attacker", "until the next look")
            await step(clock, seconds: 1, provider, runnerWaits: true)
            #expect(await eventually { contents(path) == "token-2" && writes.all.count == 3 })
            #expect(runner.status().problem == nil)
        }
        #expect(writes.all.map(\.isRestore) == [false, false, true])
        #expect(writes.all.map(\.version) == [1, 2, 2])
        #expect(source.fetchCount == 2)
    }

    @Test func aProviderReadOnlyByASinkNeverPausesWhileIdle() async throws {
        // Without a sink, the same provider pauses: nobody reads it for tokenRefreshDelaySec.
        let alone = ScriptedSource()
        let clock = ManualClock()
        let idle = provider(alone, clock)
        await running(idle, nil) {
            #expect(await eventually { idle.status().version == 1 })
            await step(clock, seconds: 60, idle, runnerWaits: false)
            #expect(idle.status().phase == .paused)
            #expect(alone.fetchCount == 2)
        }

        let directory = try privateDirectory()
        let path = directory.path("p.token")
        let (sinkClock, source) = (ManualClock(), ScriptedSource())
        let watched = provider(source, sinkClock)
        let runner = try SinkRunner(configuration: SinkConfiguration(provider: "p", path: path), provider: watched)
        await running(watched, runner) {
            #expect(await eventually { contents(path) == "token-1" && watched.status().waiters == 1 })
            await step(sinkClock, seconds: 60, watched, runnerWaits: true)
            #expect(watched.status().phase != .paused)
            #expect(source.fetchCount == 7, "a refresh every 10 s: at 0, 10, …, 60 s")
            #expect(await eventually { contents(path) == "token-7" })
        }
    }

    @Test func theRunnerEndsWhenItsProviderShutsDownOrItsTaskIsCancelled() async throws {
        let directory = try privateDirectory()
        let (clock, source) = (ManualClock(), ScriptedSource())
        let provider = provider(source, clock)
        let service = Task { await provider.run() }
        let first = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: directory.path("a")), provider: provider)
        let second = try SinkRunner(
            configuration: SinkConfiguration(provider: "p", path: directory.path("b")), provider: provider)
        let firstTask = Task { await first.run() }
        let secondTask = Task { await second.run() }
        #expect(await eventually { first.status().writes == 1 && second.status().writes == 1 })
        #expect(await eventually { provider.status().waiters == 2 })
        secondTask.cancel()
        await secondTask.value
        #expect(await eventually { provider.status().waiters == 1 }, "the cancelled runner's wait is gone")
        provider.shutDown()
        await firstTask.value
        await service.value
        #expect(contents(directory.path("a")) == "token-1" && contents(directory.path("b")) == "token-1")
    }
}

/// Collects a runner's reports.
private final class Recorder: Sendable {
    private let writes = Lock<[SinkEvents.Write]>([])

    var events: SinkEvents { SinkEvents { [writes] write in writes.withLock { $0.append(write) } } }
    var all: [SinkEvents.Write] { writes.withLock { $0 } }
}
