import Glibc

/// A value guarded by a `pthread_mutex_t`: the broker's lock, used wherever it keeps shared
/// mutable state.
///
/// It has the shape of `Synchronization.Mutex` (`init(_:)`, `withLock`), and exists because
/// ThreadSanitizer cannot see `Mutex`'s lock on this toolchain: `Mutex` locks with its own futex
/// calls, which TSan does not intercept, so a program that touches its state only inside
/// `withLock` still draws "Swift access race" reports. TSan intercepts `pthread_mutex_lock` and
/// `pthread_mutex_unlock`, so with this lock every report is a real race. It costs nothing
/// measurable against `Mutex` (release builds under wrk on `GET /token`, alternated rounds: the
/// same requests a second and CPU per request, within the rounds' spread), so every build uses
/// it, not only TSan builds.
///
/// The mutex and the value live in one heap object (a `ManagedBuffer`), so that the mutex never
/// moves once initialised; a copy of a `Lock` shares them, as a copy of a class reference does.
///
/// - Important: the lock is not recursive: calling `withLock` again from inside its closure, on
///   the same lock, deadlocks. Keep the closure short and call nothing that can block in it.
public struct Lock<Value> {
    @usableFromInline let storage: Storage

    /// Creates a lock guarding `initialValue`.
    public init(_ initialValue: Value) {
        storage = Storage.create(initialValue)
    }

    /// Runs `body` with the value, under the lock, and returns what `body` returns.
    @inlinable @inline(__always)
    public func withLock<Result, E: Error>(
        _ body: (inout Value) throws(E) -> Result
    ) throws(E) -> Result {
        try storage.withLock(body)
    }

    // MARK: - Storage

    /// The value as the buffer's header and the mutex as its one element.
    @usableFromInline
    final class Storage: ManagedBuffer<Value, pthread_mutex_t> {
        static func create(_ initialValue: Value) -> Storage {
            let buffer = Storage.create(minimumCapacity: 1) { _ in initialValue }
            buffer.withUnsafeMutablePointerToElements { mutex in
                mutex.initialize(to: pthread_mutex_t())
                let status = pthread_mutex_init(mutex, nil)
                precondition(status == 0, "pthread_mutex_init failed: \(status)")
            }
            // `create` returns the class it was called on: ManagedBuffer's own documentation
            // uses this cast.
            return unsafeDowncast(buffer, to: Storage.self)
        }

        @inlinable @inline(__always)
        func withLock<Result, E: Error>(
            _ body: (inout Value) throws(E) -> Result
        ) throws(E) -> Result {
            try withUnsafeMutablePointers { value, mutex throws(E) -> Result in
                // Locking fails only on a corrupt or uninitialised mutex, neither of which can
                // happen to one that `create` initialised and `deinit` alone destroys.
                pthread_mutex_lock(mutex)
                defer { pthread_mutex_unlock(mutex) }
                return try body(&value.pointee)
            }
        }

        deinit {
            // The value is the header, a stored property, which the class destroys itself.
            withUnsafeMutablePointerToElements { mutex in
                pthread_mutex_destroy(mutex)
                mutex.deinitialize(count: 1)
            }
        }
    }
}

/// The value is only ever reached under the mutex, so a lock can be shared between threads when
/// its value can be sent between them.
extension Lock: @unchecked Sendable where Value: Sendable {}
