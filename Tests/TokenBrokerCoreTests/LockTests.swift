import Glibc
import Testing
import TokenBrokerCore

/// `Lock` against threads that mutate one value at once: every change must be kept, and a value
/// must be released when the last copy of its lock goes.
///
/// Run under ThreadSanitizer (`swift test --sanitize=thread --filter LockTests`) these are the
/// check that TSan sees the lock: with `Synchronization.Mutex` in its place, the same test draws
/// "Swift access race" reports, though it is correct.
struct LockTests {
    final class Tracked: Sendable {
        let released: Lock<Bool>
        init(released: Lock<Bool>) { self.released = released }
        deinit { released.withLock { $0 = true } }
    }

    @Test func threadsIncrementingUnderTheLockLoseNoIncrement() {
        let threads = 4
        let increments = 20_000
        let counter = Lock<[Int]>([0, 0])
        var handles: [pthread_t] = []
        for _ in 0..<threads {
            var handle = pthread_t()
            let context = Unmanaged.passRetained(
                Box {
                    for _ in 0..<increments {
                        counter.withLock {
                            $0[0] += 1
                            $0[1] = $0[0]
                        }
                    }
                })
            let status = pthread_create(
                &handle, nil,
                { context in
                    let box = Unmanaged<Box>.fromOpaque(context!).takeRetainedValue()
                    box.body()
                    return nil
                }, context.toOpaque())
            #expect(status == 0)
            handles.append(handle)
        }
        for handle in handles { pthread_join(handle, nil) }
        #expect(counter.withLock { $0 } == [threads * increments, threads * increments])
    }

    @Test func theValueIsReleasedWithTheLastCopyOfTheLock() {
        let released = Lock(false)
        do {
            let lock = Lock<Tracked?>(Tracked(released: released))
            let copy = lock
            _ = copy.withLock { $0 }
            #expect(released.withLock { $0 } == false)
        }
        #expect(released.withLock { $0 } == true)
    }

    @Test func withLockReturnsAndRethrowsWhatItsBodyDoes() {
        struct Refused: Error {}
        let lock = Lock(1)
        #expect(
            lock.withLock { value -> Int in
                value += 1
                return value * 10
            } == 20)
        #expect(throws: Refused.self) { try lock.withLock { _ throws(Refused) in throw Refused() } }
        #expect(lock.withLock { $0 } == 2)
    }

    /// A closure that a thread runs, passed through `pthread_create`'s context pointer.
    final class Box: Sendable {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
}
