internal import CMicroHTTPD
import Glibc
import Synchronization

/// One thread per listener that watches connections where libmicrohttpd does not:
///
/// - **Hang-ups of suspended requests.** libmicrohttpd stops polling a suspended connection, so
///   it would learn of a hang-up only when the answer is written, perhaps minutes later, and the
///   waiter would be kept until then. The sockets of suspended connections sit in one epoll set
///   of this watcher's own, and `EPOLLRDHUP` is reported at once.
/// - **Request deadlines (slow-loris).** libmicrohttpd's connection timeout counts idle time, so
///   a client that sends one header byte a second is never cut off. Every connection carries a
///   `ConnectionClock`; a request must arrive whole within the timeout of the connection opening
///   or of the previous answer, and a connection past its deadline is shut down.
/// - **Memory after bursts.** After thousands of waiters, freed memory is handed back
///   (`malloc_trim`) once things are quiet, off the request path.
///
/// - Important: a socket must be unwatched before its connection is resumed, so that the
///   watcher never sees a descriptor that libmicrohttpd has closed and reused.
final class ConnectionWatcher: @unchecked Sendable {
    private let epoll: Int32
    private let wakeup: Int32
    private let watched = Mutex<[Int32: HTTPResponder]>([:])
    private let clocks = Mutex<[ObjectIdentifier: ConnectionClock]>([:])
    private var thread = pthread_t()
    private let stopping = Atomic<Bool>(false)
    private let trimRequested = Atomic<Bool>(false)
    private let requestTimeoutMsec: Int64

    /// - Parameter requestTimeoutSec: how long a request may take to arrive.
    init(requestTimeoutSec: Int) {
        requestTimeoutMsec = Int64(requestTimeoutSec) * 1000
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeup = eventfd(0, Int32(EFD_CLOEXEC))
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeup
        epoll_ctl(epoll, EPOLL_CTL_ADD, wakeup, &event)
        let context = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&thread, nil, { context in
            let watcher = Unmanaged<ConnectionWatcher>.fromOpaque(context!).takeRetainedValue()
            watcher.loop()
            return nil
        }, context)
    }

    /// Connections open now.
    var openConnections: Int { clocks.withLock { $0.count } }

    // MARK: - Request deadlines

    /// A new connection: its first request is due within the timeout.
    func opened(_ clock: ConnectionClock) {
        clock.armDeadline(after: requestTimeoutMsec)
        clocks.withLock { $0[ObjectIdentifier(clock)] = clock }
    }

    /// A request was answered: the next one is due within the timeout.
    func answered(_ clock: ConnectionClock) { clock.armDeadline(after: requestTimeoutMsec) }

    /// The connection is closing; called before libmicrohttpd closes its socket.
    func closed(_ clock: ConnectionClock) {
        clocks.withLock { $0[ObjectIdentifier(clock)] = nil }
    }

    /// Shuts down every connection past its request deadline; libmicrohttpd then sees the socket
    /// end and closes the connection itself. Runs under the lock, so no socket is closed (and
    /// its number reused) meanwhile.
    private func cutLateConnections() {
        let now = ConnectionClock.nowMsec()
        clocks.withLock { clocks in
            for clock in clocks.values where clock.isLate(now) {
                shutdown(clock.fd, Int32(SHUT_RDWR))
            }
        }
    }

    // MARK: - Hang-ups

    /// Starts watching `fd` for the responder's client going away.
    func watch(_ fd: Int32, _ responder: HTTPResponder) {
        guard fd >= 0 else { return }
        watched.withLock { watched in
            var event = epoll_event()
            event.events = EPOLLRDHUP.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue
            event.data.fd = fd
            if epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) == 0 { watched[fd] = responder }
        }
    }

    /// Stops watching `fd`; call it before the connection is resumed.
    func unwatch(_ fd: Int32) {
        guard fd >= 0 else { return }
        watched.withLock { watched in
            if watched.removeValue(forKey: fd) != nil { epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil) }
        }
    }

    /// Asks the watcher's thread to hand freed memory back to the system (`malloc_trim`) once
    /// things are quiet for half a second: after a burst of thousands of waiters, the allocator
    /// would otherwise keep their memory resident.
    func requestMemoryTrim() {
        trimRequested.store(true, ordering: .relaxed)
        var one: UInt64 = 1
        _ = write(wakeup, &one, 8)
    }

    /// Stops the thread and waits for it.
    func stop() {
        guard !stopping.exchange(true, ordering: .relaxed) else { return }
        var one: UInt64 = 1
        _ = write(wakeup, &one, 8)
        pthread_join(thread, nil)
        close(epoll)
        close(wakeup)
    }

    private func loop() {
        var events = [epoll_event](repeating: epoll_event(), count: 64)
        var nextSweep = ConnectionClock.nowMsec() + 1000
        while !stopping.load(ordering: .relaxed) {
            let trimPending = trimRequested.load(ordering: .relaxed)
            let count = epoll_wait(epoll, &events, Int32(events.count), trimPending ? 500 : 1000)
            if count == 0, trimRequested.exchange(false, ordering: .relaxed) { malloc_trim(0) }
            let now = ConnectionClock.nowMsec()
            if now >= nextSweep {
                cutLateConnections()
                nextSweep = now + 1000
            }
            guard count > 0 else { continue }
            for event in events.prefix(Int(count)) {
                if event.data.fd == wakeup {
                    var value: UInt64 = 0
                    _ = read(wakeup, &value, 8)
                    continue
                }
                let fd = event.data.fd
                let responder = watched.withLock { watched -> HTTPResponder? in
                    guard let responder = watched.removeValue(forKey: fd) else { return nil }
                    epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil)
                    return responder
                }
                responder?.clientHungUp()
            }
        }
    }
}

/// A connection's request deadline, kept in libmicrohttpd's socket context.
///
/// The request path touches it twice per request, each time with one atomic store: cleared
/// when the request has arrived whole, set again when the answer is done.
final class ConnectionClock: @unchecked Sendable {
    let fd: Int32
    /// Monotonic milliseconds by which the next request must have arrived; 0 when none is due.
    private let deadline = Atomic<Int64>(0)

    init(fd: Int32) { self.fd = fd }

    func armDeadline(after milliseconds: Int64) { deadline.store(Self.nowMsec() + milliseconds, ordering: .relaxed) }
    func requestArrived() { deadline.store(0, ordering: .relaxed) }

    func isLate(_ now: Int64) -> Bool {
        let due = deadline.load(ordering: .relaxed)
        return due != 0 && now > due
    }

    static func nowMsec() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }
}
