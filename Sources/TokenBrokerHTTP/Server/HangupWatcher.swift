internal import CMicroHTTPD
import Glibc
import Synchronization

/// Notices when a client hangs up while its request is suspended.
///
/// libmicrohttpd stops polling a suspended connection, so it would learn of a hang-up only when
/// the answer is written, perhaps minutes later, and the waiter would be kept until then. This
/// watcher puts the sockets of suspended connections in one epoll set of its own, watched by one
/// thread for every connection (not a thread per waiter), and reports `EPOLLRDHUP` at once.
///
/// - Important: a socket must be unwatched before its connection is resumed, so that the
///   watcher never sees a descriptor that libmicrohttpd has closed and reused.
final class HangupWatcher: @unchecked Sendable {
    private let epoll: Int32
    private let wakeup: Int32
    private let watched = Mutex<[Int32: HTTPResponder]>([:])
    private var thread = pthread_t()
    private let stopping = Atomic<Bool>(false)
    private let trimRequested = Atomic<Bool>(false)

    init() {
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeup = eventfd(0, Int32(EFD_CLOEXEC))
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeup
        epoll_ctl(epoll, EPOLL_CTL_ADD, wakeup, &event)
        let context = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&thread, nil, { context in
            let watcher = Unmanaged<HangupWatcher>.fromOpaque(context!).takeRetainedValue()
            watcher.loop()
            return nil
        }, context)
    }

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
    /// things are quiet for half a second, off the request path: after a burst of thousands of
    /// waiters, the allocator would otherwise keep their memory resident.
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
        while !stopping.load(ordering: .relaxed) {
            let trimPending = trimRequested.load(ordering: .relaxed)
            let count = epoll_wait(epoll, &events, Int32(events.count), trimPending ? 500 : -1)
            if count == 0, trimRequested.exchange(false, ordering: .relaxed) { malloc_trim(0) }
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
