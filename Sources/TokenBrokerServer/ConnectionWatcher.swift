internal import CMicroHTTPD
internal import CSystem
import Glibc
import Synchronization
import TokenBrokerCore

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
/// - **Room for new connections.** A client that opens connections and sends nothing would
///   otherwise fill the listener's connection limit until their deadlines pass, and a health
///   check would wait behind them. Past `evictAbove` open connections, each new one shuts down
///   the connection that has waited longest for its next request head. A connection whose head
///   has arrived (its body still coming, its answer being made, a suspended long-poll) is never
///   picked; one whose head is still trickling in cannot be told from an idle one, and may be.
/// - **Memory after bursts.** After thousands of waiters, freed memory is handed back
///   (`malloc_trim`) once things are quiet, off the request path.
///
/// Waking thousands of waiters costs no system call here: a socket stays in the epoll set when
/// its request is answered, and leaves it when libmicrohttpd closes it (the kernel drops a closed
/// socket from every epoll set) or when the watcher sees its hang-up. Each registration carries
/// a serial number next to the descriptor, so an event that was already read when its socket
/// closed, and the number was reused by a new connection, is recognised as stale and ignored.
///
/// - Important: `closed` must be called before libmicrohttpd closes the socket (its
///   `MHD_CONNECTION_NOTIFY_CLOSED` is), so that a reused descriptor is never taken for the old one.
final class ConnectionWatcher: @unchecked Sendable {
    // @unchecked: only `thread` is mutable: set in `init` before the watcher is shared, read once by `stop`.
    private let epoll: Int32
    private let wakeup: Int32
    private let state = Lock<State>(State())
    private var thread = pthread_t()
    private let stopping = Atomic<Bool>(false)
    private let trimRequested = Atomic<Bool>(false)
    private let requestTimeoutMsec: Int64
    private let evictAbove: Int

    /// - Parameters:
    ///   - requestTimeoutSec: how long a request may take to arrive.
    ///   - evictAbove: open connections past which a new one makes room by closing the longest idle.
    /// - Throws: the reason, when the kernel refuses the watcher's epoll set, its wake-up
    ///   descriptor or its thread; the listener cannot start without them.
    init(requestTimeoutSec: Int, evictAbove: Int) throws(WatcherError) {
        requestTimeoutMsec = Int64(requestTimeoutSec) * 1000
        self.evictAbove = evictAbove
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw WatcherError(call: "epoll_create1", code: errno) }
        wakeup = eventfd(0, Int32(EFD_CLOEXEC))
        guard wakeup >= 0 else {
            let code = errno
            close(epoll)
            throw WatcherError(call: "eventfd", code: code)
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.u64 = Self.wakeupKey
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, wakeup, &event) == 0 else {
            let code = errno
            close(epoll)
            close(wakeup)
            throw WatcherError(call: "epoll_ctl", code: code)
        }
        let started = SystemThread.start(&thread) { [self] in loop() }
        guard started == 0 else {
            close(epoll)
            close(wakeup)
            stopping.store(true, ordering: .relaxed)
            throw WatcherError(call: "pthread_create", code: started)
        }
    }

    /// A system call the watcher cannot do without failed.
    struct WatcherError: Error, CustomStringConvertible {
        let call: String
        let code: Int32
        var description: String { "\(call) failed: \(String(cString: strerror(code)))" }
    }

    /// Open connections, and the sockets in the epoll set.
    private struct State {
        var clocks: [ObjectIdentifier: ConnectionClock] = [:]
        /// By descriptor: the registration's serial number, and the responder of the request that
        /// was suspended when it was made (answered since, perhaps: then a hang-up finds nothing to do).
        var registered: [Int32: (serial: UInt32, responder: HTTPResponder)] = [:]
        var serial: UInt32 = 0
        var evicted = 0
    }

    /// The epoll event's data: the descriptor in the low half, the registration's serial in the high.
    private static func eventKey(_ fd: Int32, _ serial: UInt32) -> UInt64 {
        UInt64(serial) << 32 | UInt64(UInt32(bitPattern: fd))
    }

    /// The wake-up descriptor's event data: no socket registration has serial 0xFFFFFFFF with descriptor -1.
    private static let wakeupKey = UInt64.max

    /// Connections open now.
    var openConnections: Int { state.withLock { $0.clocks.count } }
    /// The same, read without the lock, as of the last connection opened or closed: a thread
    /// polling a daemon reads it before each turn (`DaemonThread`), and sees its own changes.
    var openConnectionsLatest: Int { openCount.load(ordering: .relaxed) }
    private let openCount = Atomic<Int>(0)
    /// Idle connections shut down to make room since start.
    var evictedConnections: Int { state.withLock { $0.evicted } }

    // MARK: - Request deadlines

    /// A new connection: its first request is due within the timeout. Past `evictAbove` open
    /// connections, one is shut down to make room: the one idle longest, or when none is idle,
    /// the one whose request has been arriving longest (its head in, its body not yet whole).
    /// So a client cannot hold every place by sending heads that promise bodies, which no
    /// route sees until they are whole; a request being answered, or waiting for its answer,
    /// is never cut.
    func opened(_ clock: ConnectionClock) {
        clock.armDeadline(after: requestTimeoutMsec)
        state.withLock { state in
            state.clocks[ObjectIdentifier(clock)] = clock
            openCount.store(state.clocks.count, ordering: .relaxed)
            guard state.clocks.count > evictAbove else { return }
            var idlest: ConnectionClock?
            var slowest: ConnectionClock?
            var earliestIdle = Int64.max
            var earliestArriving = Int64.max
            for other in state.clocks.values where other !== clock && !other.evicted {
                // 0: a request is being answered, or waits for its answer.
                let due = other.dueMsec
                guard due != 0 else { continue }
                if other.awaitsHead {
                    if due < earliestIdle { (earliestIdle, idlest) = (due, other) }
                } else if due < earliestArriving {
                    (earliestArriving, slowest) = (due, other)
                }
            }
            guard let idlest = idlest ?? slowest else { return }
            idlest.markEvicted()
            state.evicted += 1
            shutdown(idlest.fd, Int32(SHUT_RDWR))
        }
    }

    /// A request was answered: the next one is due within the timeout.
    func answered(_ clock: ConnectionClock) { clock.armDeadline(after: requestTimeoutMsec) }

    /// The connection is closing; called before libmicrohttpd closes its socket, whose
    /// registration the kernel then drops.
    func closed(_ clock: ConnectionClock) {
        state.withLock { state in
            state.clocks[ObjectIdentifier(clock)] = nil
            openCount.store(state.clocks.count, ordering: .relaxed)
            state.registered[clock.fd] = nil
        }
    }

    /// Shuts down every connection past its request deadline; libmicrohttpd then sees the socket
    /// end and closes the connection itself. Runs under the lock, so no socket is closed (and
    /// its number reused) meanwhile.
    private func cutLateConnections() {
        let now = ConnectionClock.nowMsec()
        state.withLock { state in
            for clock in state.clocks.values where clock.isLate(now) {
                shutdown(clock.fd, Int32(SHUT_RDWR))
            }
        }
    }

    // MARK: - Hang-ups

    /// Starts watching `fd` for the responder's client going away. Nothing needs undoing when
    /// the request is answered: a later hang-up finds the responder answered and does nothing.
    ///
    /// A socket already in the set (a keep-alive connection, one of whose requests was
    /// suspended before) keeps its registration, which now names this responder: no system call,
    /// for every proxied request. `closed` and `hungUp` remove the entry when the socket leaves
    /// the set, so an entry is always about the connection now on its descriptor, and its events
    /// are level-triggered, so a hang-up already pending is reported again for the new responder.
    /// This relies on `closed` coming before the socket is closed (see the type's note): an entry
    /// left for a closed socket would keep a new connection on its number out of the set.
    func watch(_ fd: Int32, _ responder: HTTPResponder) {
        guard fd >= 0 else { return }
        state.withLock { state in
            if let registration = state.registered[fd] {
                state.registered[fd] = (registration.serial, responder)
                return
            }
            state.serial &+= 1
            var event = epoll_event()
            event.events = EPOLLRDHUP.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue
            event.data.u64 = Self.eventKey(fd, state.serial)
            var done = epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) == 0
            // In the set without an entry (its removal failed when it hung up): take it over.
            if !done, errno == EEXIST { done = epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event) == 0 }
            state.registered[fd] = done ? (state.serial, responder) : nil
        }
    }

    /// An event read from the set: the responder whose client hung up, if the event is about
    /// the current registration of its socket (which then leaves the set).
    private func hungUp(_ key: UInt64) -> HTTPResponder? {
        let fd = Int32(bitPattern: UInt32(truncatingIfNeeded: key))
        return state.withLock { state -> HTTPResponder? in
            guard let registration = state.registered[fd], Self.eventKey(fd, registration.serial) == key else {
                return nil
            }
            state.registered[fd] = nil
            epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil)
            return registration.responder
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
                if event.data.u64 == Self.wakeupKey {
                    var value: UInt64 = 0
                    _ = read(wakeup, &value, 8)
                    continue
                }
                hungUp(event.data.u64)?.clientHungUp()
            }
        }
    }
}
