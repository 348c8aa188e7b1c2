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
///
/// Why the thread sometimes waits itself (`turn()`): libmicrohttpd 0.9.75's epoll loop reads at
/// most 128 events a call, and reads again after a call that filled all 128, with the turn's
/// whole timeout (daemon.c, `MHD_epoll`, the `MAX_EVENTS` loop). When exactly 128 were ready,
/// that second wait finds nothing and blocks with their connections unserved, until some other
/// event or the nearest connection timeout: 128 keep-alive clients of one thread sending at once
/// waited 30 s, and were then cut off. So the thread lets libmicrohttpd block only when its epoll
/// set cannot hold 128 ready descriptors; with more connections it waits on the epoll set itself
/// and has libmicrohttpd read it without waiting.
final class DaemonThread: @unchecked Sendable {
    // @unchecked: `handle` is used on the thread alone, but for `MHD_resume_connection`, which
    // libmicrohttpd allows from any thread; `thread` is written before the thread starts.

    let handle: OpaquePointer
    /// The daemon's epoll descriptor, which the thread waits on itself when libmicrohttpd may not.
    private let epoll: Int32
    /// The server's, whose count of open connections (all its daemons') bounds this daemon's.
    private let watcher: ConnectionWatcher
    private let wakeup: Int32
    private var thread = pthread_t()
    /// Work for the thread, and whether it must stop after it.
    private let queue = Lock<(work: [@Sendable () -> Void], stop: Bool)>(([], false))
    /// Set with each wake-up: the thread reads the eventfd (to clear it) only then, not at every turn.
    private let woken = Atomic<Bool>(false)

    /// Prepares the thread for `handle`, a daemon started in external mode with epoll: its
    /// wake-up in the daemon's epoll set. `start()` starts it.
    /// - Parameter watcher: the server's, told of each connection the daemon opens and closes.
    /// - Throws: the reason, naming the call the kernel refused; the daemon is not stopped.
    init(_ handle: OpaquePointer, watcher: ConnectionWatcher) throws(StartFailure) {
        self.handle = handle
        self.watcher = watcher
        epoll = CMicroHTTPD_daemon_epoll_fd(handle)
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
            turn()
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

    /// The most descriptors, besides connections, in the daemon's epoll set: the listening socket
    /// and the wake-up (libmicrohttpd adds its inter-thread channel only to daemons with threads
    /// of their own, and its upgrade descriptor only with TLS). Kept generous.
    private static let otherDescriptors: UInt32 = 8
    /// The events libmicrohttpd 0.9.75 reads from its epoll set in one call (`MAX_EVENTS`).
    private static let eventsPerRead: UInt32 = 128

    /// One turn of the daemon: waits for its next event or timeout and serves what is ready.
    private func turn() {
        // The connections counted here are the most the set holds during the turn: the ones
        // accepted in it are added after libmicrohttpd's wait. The server's count, all its
        // daemons' and read without a lock, settles most turns; libmicrohttpd's own, for this
        // daemon alone, takes a lock and a pass over the connections to clean up.
        let fewest = Int(Self.eventsPerRead - Self.otherDescriptors)
        let connections =
            watcher.openConnectionsLatest < fewest ? 0 : Int(CMicroHTTPD_daemon_connections(handle))
        guard connections >= fewest else {
            _ = MHD_run_wait(handle, -1)  // fewer than 128 events can be ready: it cannot block twice
            return
        }
        _ = MHD_run_wait(handle, 0)
        // libmicrohttpd decides whether the listening socket belongs in the set at the start of
        // a turn, from the connections left at the end of the last: when some closed in this
        // turn, the next one must run before any wait, or new clients would wait unseen.
        guard Int(CMicroHTTPD_daemon_connections(handle)) >= connections else { return }
        var ready = pollfd(fd: epoll, events: Int16(POLLIN), revents: 0)
        _ = poll(&ready, 1, CMicroHTTPD_wait_ms(handle))
    }
}
