internal import CMicroHTTPD
internal import CSystem
import Dispatch
import Glibc
import Synchronization
import TokenBrokerCore

/// One libmicrohttpd daemon in external mode, run by a thread of the server's own exactly as
/// libmicrohttpd's internal polling thread runs one (`MHD_run_wait` until it stops), so that the
/// calls that must not race with the polling, quiescing and stopping the daemon, are made on
/// that very thread (`run(_:)`).
///
/// Why not libmicrohttpd's own threads: in 0.9.75, `MHD_quiesce_daemon` called beside a daemon's
/// polling thread races with it over the listening socket's place in the thread's epoll set.
/// Both take it out; whichever finds it already gone aborts the process ("Failed to remove
/// listen FD from epoll set", daemon.c lines 5531 and 4940). A daemon near its connection limit
/// takes the socket out and puts it back as connections come and go, and a stop then aborted
/// within a few tries (`HTTPServerTests.stoppingNearTheConnectionLimitUnderChurnNeverAborts`).
///
/// The thread's wake-up is an eventfd in the daemon's own epoll set, registered with a null
/// pointer: libmicrohttpd 0.9.75's epoll loop skips an event whose pointer is null (it holds
/// that value for its own shutdown signal, and registers nothing with it in this mode), and
/// its wait ends, so the thread runs the work queued for it.
final class DaemonThread: @unchecked Sendable {
    // @unchecked: `handle` is used on the thread alone, but for `MHD_resume_connection`, which
    // libmicrohttpd allows from any thread; `thread` is written before the thread starts.

    let handle: OpaquePointer
    private let wakeup: Int32
    private var thread = pthread_t()
    /// Work for the thread, and whether it must stop after it.
    private let queue = Lock<(work: [@Sendable () -> Void], stop: Bool)>(([], false))
    /// Set with each wake-up: the thread reads the eventfd (to clear it) only then, not at every turn.
    private let woken = Atomic<Bool>(false)

    /// Prepares the thread for `handle`, a daemon started in external mode with epoll: its
    /// wake-up in the daemon's epoll set. `start()` starts it.
    /// - Throws: the reason, naming the call the kernel refused; the daemon is not stopped.
    init(_ handle: OpaquePointer) throws(StartFailure) {
        self.handle = handle
        let epoll = CMicroHTTPD_daemon_epoll_fd(handle)
        guard epoll >= 0 else { throw StartFailure(reason: "libmicrohttpd gave no epoll descriptor") }
        // From here on every property is set, and a throw runs `deinit`, which closes the eventfd.
        wakeup = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeup >= 0 else { throw StartFailure(reason: "eventfd failed: \(String(cString: strerror(errno)))") }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.ptr = nil
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, wakeup, &event) == 0 else {
            throw StartFailure(reason: "epoll_ctl failed: \(String(cString: strerror(errno)))")
        }
    }

    /// Starts the thread, which polls the daemon from then on; returns why it could not, or nil.
    func start() -> String? {
        let started = SystemThread.start(&thread) { [self] in loop() }
        guard started == 0 else {
            return "cannot start the listener's thread: \(String(cString: strerror(started)))"
        }
        return nil
    }

    /// Why the thread could not start: the call the kernel refused, and its reason.
    struct StartFailure: Error {
        let reason: String
    }

    /// Runs `work` on the daemon's thread between two turns and returns once it has run. Called
    /// on the daemon's own thread, it runs `work` at once.
    func run(_ work: @escaping @Sendable () -> Void) {
        guard !isCurrent else { return work() }
        let done = DispatchSemaphore(value: 0)
        post {
            work()
            done.signal()
        }
        done.wait()
    }

    /// Stops the daemon on its thread (`MHD_stop_daemon`, which closes its connections) and
    /// waits for the thread to end. Once, after `start()`; nothing may use the daemon after. The eventfd stays
    /// open until the thread object goes, so that a late `wake()` never writes to a descriptor
    /// number reused since.
    func stop() {
        precondition(!isCurrent, "a listener's daemon stopped from its own thread")
        post(stopping: true) { [self] in MHD_stop_daemon(handle) }
        pthread_join(thread, nil)
    }

    deinit { if wakeup >= 0 { close(wakeup) } }

    private func post(stopping: Bool = false, _ work: @escaping @Sendable () -> Void) {
        queue.withLock {
            $0.work.append(work)
            $0.stop = $0.stop || stopping
        }
        wake()
    }

    /// Whether the calling thread is the daemon's.
    private var isCurrent: Bool { pthread_equal(pthread_self(), thread) != 0 }

    /// Ends the daemon's current wait, from any thread: after `MHD_resume_connection`, which in
    /// external mode wakes nothing (libmicrohttpd keeps no inter-thread channel there), so that
    /// the next turn takes the resumed connection.
    func wake() {
        // The eventfd before the flag: the thread clears the eventfd only after it took the
        // flag, so an eventfd left readable always has a flag on its way (the thread turns
        // until the flag comes, then clears it), and work queued before a write it cleared was
        // taken with it.
        var one: UInt64 = 1
        _ = write(wakeup, &one, 8)
        woken.store(true, ordering: .releasing)
    }

    /// The thread: the daemon's turns, and the work posted between them.
    private func loop() {
        while true {
            _ = MHD_run_wait(handle, -1)
            guard woken.exchange(false, ordering: .acquiringAndReleasing) else { continue }
            var count: UInt64 = 0
            _ = read(wakeup, &count, 8)
            let (work, stop) = queue.withLock { queued in
                defer { queued.work = [] }
                return (queued.work, queued.stop)
            }
            for item in work { item() }
            if stop { return }
        }
    }
}
