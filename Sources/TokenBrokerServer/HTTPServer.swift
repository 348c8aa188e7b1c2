internal import CMicroHTTPD
import Glibc
import Synchronization
import TokenBrokerCore

/// One listener: libmicrohttpd daemons answering through an `HTTPHandler`, each polling the
/// same listening socket on a thread of its own.
///
/// Each daemon runs in external mode with epoll: on a thread the server starts for it
/// (`DaemonThread`, `Configuration.threads` of them) or, when the configuration names event
/// loops (`Configuration.eventLoops`), on that loop's thread, one daemon per loop. Either way
/// the daemon is quiesced and stopped on the thread that polls it, never beside it (see
/// `DaemonThread` for why). Deferred answers suspend their
/// connection (`MHD_suspend_connection`), so a waiting request holds a few hundred bytes, not a
/// thread. At most seven eighths of the connection limit may wait so (`WaitingPlaces`): a
/// waiting connection is never closed to make room, and the rest is kept for requests answered
/// at once. Responses are queued on the second call of the access handler, never the first,
/// which keeps keep-alive working.
///
/// - Important: call `shutDown` before releasing the server; it answers every suspended
///   connection first, since libmicrohttpd must not be stopped with connections suspended.
public final class HTTPServer: @unchecked Sendable {
    // @unchecked: `stopped` and `listenSocket` change only in `init` and `shutDown`, never on
    // libmicrohttpd's threads; `daemonThreads` and `loopDaemons` only in `init`.

    public let configuration: Configuration
    /// The port actually bound (the configured one, or the one picked for port 0).
    public let port: UInt16
    /// The routes, read once per request; `replaceHandler` swaps them (a configuration reload).
    private let handlerSlot: Lock<any HTTPHandler>
    private var handler: any HTTPHandler { handlerSlot.withLock { $0 } }
    /// The handler's answer to a request whose client closed while it waited, asked for once.
    let clientClosedAnswer: HTTPResponse
    /// The daemons on threads of the server's own (stopped, once the server is); none when they
    /// run on event loops.
    private var daemonThreads: [DaemonThread] = []
    /// The daemons run by event loops, one per loop, each a source of its loop.
    private var loopDaemons: [LoopDaemon] = []
    private var stopped = false
    private var listenSocket: Int32 = -1
    /// The suspended connections.
    ///
    /// Lock order: a stream's lock (`HTTPResponseStream`, `HTTPRequestBodyStream`), then this
    /// one: a stream suspends its connection (`suspendForStream`) while holding its own lock.
    /// Never the other way round: nothing is called out of this lock (shutting down copies the
    /// responders out before answering them), and `MHD_suspend_connection` and
    /// `MHD_resume_connection` are called after it is released.
    private let suspended = Lock<Suspended>(Suspended())
    private let watcher: ConnectionWatcher
    /// The places for requests that wait (deferred answers): seven eighths of the connection limit.
    let waitingPlaces: WaitingPlaces
    private let requestsInFlight = Atomic<Int>(0)
    /// Resumes taken out of `suspended` whose `MHD_resume_connection` has not returned yet.
    private let resumesUnderWay = Atomic<Int>(0)
    /// Set when the grace ends: streams may no longer suspend their connection.
    private let stopping = Atomic<Bool>(false)
    /// Set when shutting down begins: new requests are refused.
    private let draining = Atomic<Bool>(false)

    /// Binds and starts serving at once.
    /// - Throws: `HTTPServerError` naming the address and the reason when it cannot bind.
    public init(configuration: Configuration, handler: any HTTPHandler) throws(HTTPServerError) {
        self.configuration = configuration
        handlerSlot = Lock(handler)
        clientClosedAnswer = handler.refusal(.clientClosed)
        waitingPlaces = WaitingPlaces(connectionLimit: configuration.connectionLimit)
        do {
            watcher = try ConnectionWatcher(
                requestTimeoutSec: configuration.connectionTimeoutSec,
                evictAbove: configuration.connectionLimit - max(1, configuration.connectionLimit / 16))
        } catch {
            throw HTTPServerError(address: configuration.address, reason: "cannot watch connections: \(error)")
        }
        listenSocket = try ListeningSocket.open(configuration.address, unixMode: configuration.unixSocketMode)
        port = ListeningSocket.boundPort(listenSocket)

        // External mode: the server's threads, or the event loops, call MHD_run.
        var flags = UInt32(MHD_USE_EPOLL.rawValue)
        flags |= UInt32(MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_ERROR_LOG.rawValue | MHD_USE_TURBO.rawValue)
        if configuration.address.isIPv6 { flags |= UInt32(MHD_USE_IPv6.rawValue) }
        let context = Unmanaged.passUnretained(self).toOpaque()
        // The logger first: libmicrohttpd warns at start when another option comes before it.
        let options: [MHD_OptionItem] = [
            CMicroHTTPD_option_logger(libraryLogCallback, context),
            MHD_OptionItem(option: .LISTEN_SOCKET, value: Int(listenSocket), ptr_value: nil),
            MHD_OptionItem(option: .CONNECTION_LIMIT, value: configuration.connectionLimit, ptr_value: nil),
            MHD_OptionItem(
                option: .CONNECTION_MEMORY_LIMIT, value: configuration.connectionMemoryLimit, ptr_value: nil),
            MHD_OptionItem(option: .CONNECTION_TIMEOUT, value: configuration.connectionTimeoutSec, ptr_value: nil),
            MHD_OptionItem(option: .LISTEN_BACKLOG_SIZE, value: 4096, ptr_value: nil),
            CMicroHTTPD_option_notify_completed(requestCompletedCallback, context),
            CMicroHTTPD_option_notify_connection(connectionNotifyCallback, context),
            // MHD_http_unescape's answers, without its byte-at-a-time pass over a target with no
            // '%'; and a look at where each query argument lies (`unescaping`).
            CMicroHTTPD_option_unescape(unescapeCallback, context),
            // The target as sent, measured before it is decoded in place (`RequestTarget`).
            CMicroHTTPD_option_uri_log(requestTargetCallback, context),
        ]
        let problem =
            configuration.eventLoops.isEmpty
            ? startOnThreads(flags: flags, options: options, context: context)
            : startOnLoops(flags: flags, options: options, context: context)
        if let problem {
            watcher.stop()
            close(listenSocket)
            throw HTTPServerError(address: configuration.address, reason: problem)
        }
    }

    /// Starts `count` daemons in external mode, each with a duplicate of the listening socket
    /// (they all poll it, and whichever accepts first takes a new connection) and its share of
    /// the connection limit, the shares adding up to it. Returns why it could not, having
    /// stopped the ones it started (nothing runs them yet).
    private func startDaemons(_ count: Int, flags: UInt32, options: [MHD_OptionItem], context: UnsafeMutableRawPointer)
        -> Result<[OpaquePointer], Failure>
    {
        var handles: [OpaquePointer] = []
        func failed(_ reason: String) -> Result<[OpaquePointer], Failure> {
            for handle in handles { MHD_stop_daemon(handle) }
            return .failure(Failure(reason: reason))
        }
        let limit = configuration.connectionLimit
        for index in 0..<count {
            let fd = dup(listenSocket)
            guard fd >= 0 else {
                return failed("cannot share the listening socket: \(String(cString: strerror(errno)))")
            }
            let share = max(1, limit / count + (index < limit % count ? 1 : 0))
            var own = options.map { item in
                switch item.option {
                case .LISTEN_SOCKET: MHD_OptionItem(option: .LISTEN_SOCKET, value: Int(fd), ptr_value: nil)
                case .CONNECTION_LIMIT: MHD_OptionItem(option: .CONNECTION_LIMIT, value: share, ptr_value: nil)
                default: item
                }
            }
            own.append(MHD_OptionItem(option: .END, value: 0, ptr_value: nil))
            let started = own.withUnsafeMutableBufferPointer { buffer in
                CMicroHTTPD_start_daemon(flags, accessHandlerCallback, context, buffer.baseAddress)
            }
            guard let handle = started else {
                // Not closed here: libmicrohttpd closes the socket it was given on some of its
                // failures and not on others, and a second close could close another's descriptor.
                return failed("libmicrohttpd could not start its daemon")
            }
            handles.append(handle)
        }
        return .success(handles)
    }

    /// Why the daemons could not start.
    private struct Failure: Error {
        let reason: String
    }

    /// Starts `Configuration.threads` daemons, each on a thread of its own. Returns why it could
    /// not, having stopped the ones it started (and set `stopped`: nothing is left to stop), or nil.
    private func startOnThreads(flags: UInt32, options: [MHD_OptionItem], context: UnsafeMutableRawPointer) -> String? {
        let handles: [OpaquePointer]
        switch startDaemons(max(1, configuration.threads), flags: flags, options: options, context: context) {
        case .success(let started): handles = started
        case .failure(let failure): return failure.reason
        }
        var prepared: [DaemonThread] = []
        for handle in handles {
            do {
                prepared.append(try DaemonThread(handle, watcher: watcher))
            } catch {
                for handle in handles { MHD_stop_daemon(handle) }
                return error.reason
            }
        }
        // Listed before any of them polls: `resume` reads the list from any thread, unlocked.
        daemonThreads = prepared
        for (index, thread) in prepared.enumerated() {
            guard let problem = thread.start() else { continue }
            for started in prepared[..<index] { started.stop() }
            for unstarted in prepared[index...] { MHD_stop_daemon(unstarted.handle) }
            stopped = true
            return problem
        }
        return nil
    }

    /// Starts one daemon per event loop and attaches each to its loop. Returns why it could not,
    /// having stopped and forgotten the ones it started, or nil.
    private func startOnLoops(flags: UInt32, options: [MHD_OptionItem], context: UnsafeMutableRawPointer) -> String? {
        let hosts = configuration.eventLoops
        let handles: [OpaquePointer]
        switch startDaemons(hosts.count, flags: flags, options: options, context: context) {
        case .success(let started): handles = started
        case .failure(let failure): return failure.reason
        }
        guard handles.allSatisfy({ CMicroHTTPD_daemon_epoll_fd($0) >= 0 }) else {
            for handle in handles { MHD_stop_daemon(handle) }
            return "libmicrohttpd gave no epoll descriptor"
        }
        for (handle, host) in zip(handles, hosts) {
            let source = EventLoopSource(
                descriptor: CMicroHTTPD_daemon_epoll_fd(handle), host: host,
                timeoutMilliseconds: { CMicroHTTPD_timeout_ms(handle) },
                run: { _ = MHD_run(handle) })
            host.attach(source)
            loopDaemons.append(LoopDaemon(handle: handle, source: source))
        }
        return nil
    }

    /// Stops the daemons run by event loops, each on its loop's thread: MHD_run must not run
    /// while it stops.
    private func stopLoopDaemons() {
        for daemon in loopDaemons {
            daemon.source.host.runOnLoop {
                daemon.source.host.detach(daemon.source)
                MHD_stop_daemon(daemon.handle)
            }
        }
    }

    /// A daemon an event loop runs. Unchecked: its handle is used on that loop's thread, but for
    /// `MHD_resume_connection`, which libmicrohttpd allows from any thread.
    private struct LoopDaemon: @unchecked Sendable {
        let handle: OpaquePointer
        let source: EventLoopSource
    }

    deinit { shutDown(grace: .zero) }

    /// Answers requests that arrive from now on with `handler`'s routes. A request already begun
    /// keeps the routes it began with, and so do answers under way; connections stay open.
    public func replaceHandler(_ handler: any HTTPHandler) {
        handlerSlot.withLock { $0 = handler }
    }

    /// Requests that are being answered or are waiting suspended.
    public var inFlight: Int { requestsInFlight.load(ordering: .relaxed) }
    /// Connections open now.
    public var openConnections: Int { watcher.openConnections }
    /// Idle connections closed to make room for new ones since start.
    public var evictedConnections: Int { watcher.evictedConnections }
    /// Requests waiting now (deferred answers not given yet).
    public var waitingRequests: Int { waitingPlaces.count }
    /// The most requests that may wait at once: seven eighths of the connection limit.
    public var waitingLimit: Int { waitingPlaces.limit }
    /// Requests refused since start because every waiting place was taken (`ServerRefusal.tooManyWaiting`).
    public var refusedWaits: Int { waitingPlaces.refused }

    /// The suspended requests, each in a slot its responder knows (parking and resuming one
    /// costs no hashing, and resuming allocates nothing), and the most there were since the
    /// last memory trim.
    private struct Suspended {
        private var table = SlotTable<HTTPResponder>()
        var peak = 0
        /// Closed by the stop: no connection may be suspended after, since `MHD_stop_daemon`
        /// aborts the process on finding one.
        private var closed = false

        var count: Int { table.count }
        var all: [HTTPResponder] { table.elements }

        /// False, and nothing kept, once closed.
        mutating func insert(_ responder: HTTPResponder) -> Bool {
            guard !closed else { return false }
            guard responder.suspendedSlot.load(ordering: .relaxed) < 0 else { return true }
            responder.suspendedSlot.store(table.insert(responder), ordering: .relaxed)
            peak = max(peak, table.count)
            return true
        }

        /// Closes the table and takes everything in it out.
        mutating func close() -> [HTTPResponder] {
            closed = true
            peak = 0  // nothing to trim for: no late resume may reach the watcher, stopped by then
            let left = table.elements
            for responder in left { _ = remove(responder) }
            return left
        }

        /// False when the responder was not suspended.
        mutating func remove(_ responder: HTTPResponder) -> Bool {
            let slot = responder.suspendedSlot.load(ordering: .relaxed)
            guard slot >= 0 else { return false }
            table.remove(at: slot)
            responder.suspendedSlot.store(-1, ordering: .relaxed)
            return true
        }
    }

    /// After this many requests waited at once, memory is handed back once they are all answered.
    private static let trimAfterPeak = 1000

    /// Stops accepting, lets requests in flight finish for up to `grace`, answers what still
    /// waits with `finalAnswer`, then stops the daemon.
    ///
    /// From the call on, new connections are refused (the listening socket is closed) and a new
    /// request on a kept-alive connection gets the handler's `refusal(.stopping)`, which must close it.
    /// Answers being prepared or streamed (a proxied exchange, a streamed body) keep going until
    /// they end or the grace runs out. Waiters whose answer only the server can give are answered
    /// with `finalAnswer` (by default the handler's `refusal(.stopped)`) near the end of the grace;
    /// the broker answers its long-polls before calling this, through its providers.
    public func shutDown(finalAnswer: HTTPResponse? = nil, grace: Duration) {
        // Once, and only for a server that started (`deinit` calls it after a failed `init` too).
        guard !stopped, !daemonThreads.isEmpty || !loopDaemons.isEmpty else { return }
        stopped = true
        let finalAnswer = finalAnswer ?? handler.refusal(.stopped)
        draining.store(true, ordering: .relaxed)
        // libmicrohttpd no longer polls the socket: close it, so that connections are refused
        // now rather than left in the backlog until the end.
        if quiesce() { closeListeningSocket() }
        let clock = ContinuousClock()
        let end = clock.now.advanced(by: grace)
        // The last quarter second (or less, for a short grace) is for the final answers to go out.
        let drained = end.advanced(by: .zero - min(grace, .milliseconds(250)))
        while inFlight > 0, clock.now < drained { usleep(10_000) }
        stopping.store(true, ordering: .relaxed)
        for responder in suspended.withLock({ $0.all }) { responder.respond(finalAnswer) }
        while inFlight > 0, clock.now < end { usleep(10_000) }
        resumeAllForGood()
        // The threads stay listed (stopped): `resume` may read the list from any thread.
        for thread in daemonThreads { thread.stop() }
        stopLoopDaemons()
        watcher.stop()
        closeListeningSocket()
    }

    /// Resumes every connection still suspended, and lets none be suspended from now on:
    /// `MHD_stop_daemon` aborts the process on finding a suspended connection that is not
    /// resuming. A request whose body ends later (a proxied upload) is closed instead of parked,
    /// and an answer given later resumes nothing. An answer given just before, whose
    /// `MHD_resume_connection` may still be under way on another thread, is waited for: after the
    /// stop, that call would touch a freed connection.
    private func resumeAllForGood() {
        let left = suspended.withLock { $0.close() }
        while resumesUnderWay.load(ordering: .acquiring) > 0 { sched_yield() }
        for responder in left { resumeConnection(responder) }
    }

    /// Stops every daemon polling the listening socket, each on the thread that polls it, and
    /// closes its copy of the socket there; true when all let it go.
    private func quiesce() -> Bool {
        let failures = Atomic<Int>(0)
        let quiesce = { @Sendable (handle: OpaquePointer) in
            let fd = MHD_quiesce_daemon(handle)
            if fd >= 0 { close(fd) } else { failures.add(1, ordering: .relaxed) }
        }
        for thread in daemonThreads { thread.run { quiesce(thread.handle) } }
        for daemon in loopDaemons {
            daemon.source.host.runOnLoop { quiesce(daemon.handle) }
        }
        return failures.load(ordering: .relaxed) == 0
    }

    /// Closes the listening socket (and removes a Unix socket's file), once.
    private func closeListeningSocket() {
        guard listenSocket >= 0 else { return }
        close(listenSocket)
        listenSocket = -1
        if let path = configuration.address.unixPath { unlink(path) }
    }

    // MARK: - libmicrohttpd callbacks

    /// The access handler: called once when headers arrive, once per body chunk, and once at the end.
    func access(
        _ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>,
        uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
        requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    ) -> MHD_Result {
        let state: RequestState?
        switch RequestPhase(requestContext.pointee) {
        case .awaitingHead:
            // First call: headers only. Answering now would lose keep-alive; come back later,
            // unless the head is refused, and then the connection closes anyway.
            requestsInFlight.add(1, ordering: .relaxed)
            requestContext.pointee = RequestPhase.headRead.context
            return headArrived(
                connection, url: url, method: method, version: version, bodyLimit: configuration.maximumBodyBytes)
                ?? CMicroHTTPD_yes()
        case .targetRead(let streaming):
            // First call of a request under the streaming prefix: decide about its body now.
            requestContext.pointee = RequestPhase.underway(streaming).context
            return headArrived(connection, url: url, method: method, version: version, bodyLimit: nil)
                ?? begin(streaming, connection, url: url, method: method, version: version)
        case .headRead:
            state = nil
        case .underway(let underway):
            state = underway
        }
        if uploadSize.pointee > 0 {
            let count = uploadSize.pointee
            uploadSize.pointee = 0
            if let stream = state?.bodyStream {
                uploadData.map { stream.append(UnsafeRawBufferPointer(start: $0, count: count)) }
            } else {
                let state = RequestState.attach(to: requestContext)
                state.append(uploadData, count: count, limit: state.bodyLimit ?? configuration.maximumBodyBytes)
            }
            return CMicroHTTPD_yes()
        }
        if let responder = state?.responder {
            if let stream = state?.bodyStream { stream.end() }
            if let response = responder.takeAnswer() { return queue(response, on: connection, responder) }
            // A streamed request whose answer is not ready yet: wait for it, suspended.
            guard state?.bodyStream != nil else { return CMicroHTTPD_no() }
            // Not once the server stopped: the answer now, if it came meanwhile, else the end.
            guard park(responder, connection) else {
                return responder.takeAnswer().map { queue($0, on: connection, responder) } ?? CMicroHTTPD_no()
            }
            // Its body is whole: a hang-up from now on is the client closing its side while it
            // waits, as for any deferred answer (a half-close reads the `clientClosed` answer).
            watcher.watch(responder.fd, responder)
            if responder.hasAnswer { resume(responder) }
            return CMicroHTTPD_yes()
        }
        if draining.load(ordering: .relaxed) { return queue(handler.refusal(.stopping), on: connection, nil) }
        Self.clock(of: connection)?.requestArrived()
        let request: HTTPRequest
        if let state, var head = state.head {
            // Begun under the streaming prefix: its head was read then, and the handler's `begin` saw it.
            state.head = nil
            head.body = state.body
            head.bodyTooLarge = state.tooLarge
            request = head
        } else if state?.tooLarge == true {
            // Read to its end (so the connection can be kept) but not kept: no route of a
            // buffered request takes more than `maximumBodyBytes`.
            return queue(handler.refusal(.bodyTooLarge), on: connection, nil)
        } else {
            request = HTTPRequest(
                method: String(cString: method), path: String(cString: url), rawTarget: state?.rawTarget,
                query: HTTPFields(connection, .GET_ARGUMENT_KIND), headers: HTTPFields(connection, .HEADER_KIND),
                body: state?.body ?? [], bodyTooLarge: state?.tooLarge ?? false)
        }
        return reply(
            handler.handle(request), path: request.path, head: request.method == "HEAD", connection, streaming: false
        ) {
            RequestState.attach(to: requestContext)
        }
    }

    /// A request's head is in: its connection is no longer one to close for room, and a head
    /// `RequestHead` refuses is answered now (400, then the connection closes), as is one that
    /// waits for `100 Continue` before a body over `bodyLimit` (413); nil when it may go on.
    /// - Parameter bodyLimit: the most body the request may have; nil: its handler decides (`begin`).
    private func headArrived(
        _ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>, bodyLimit: Int?
    ) -> MHD_Result? {
        let clock = Self.clock(of: connection)
        clock?.headArrived()
        let room = AnswerRoom.left(connection, memory: configuration.connectionMemoryLimit)
        if room < AnswerRoom.reserve {
            return refuseHeadTooLarge(connection, room: room, method: method)
        }
        if clock?.targetReadLength == RequestTarget.queryCut {
            return queue(handler.refusal(.tooManyQueryArguments), on: connection, nil)
        }
        var awaitedBodyLength: Int?
        if let problem = RequestHead.problem(
            connection, url: url, method: method, version: version, targetLength: clock?.targetReadLength ?? -1,
            awaitedBodyLength: &awaitedBodyLength)
        {
            return queue(handler.refusal(.malformedHead(problem)), on: connection, nil)
        }
        // Answered instead of `100 Continue`: the client sends no body, and the connection
        // closes after the answer. A body sent without waiting is read, then refused.
        if let bodyLimit, let awaitedBodyLength, awaitedBodyLength > bodyLimit {
            return queue(handler.refusal(.bodyTooLarge), on: connection, nil)
        }
        return nil
    }

    /// Answers 431 to a head that leaves `room` bytes of the connection's memory: through
    /// libmicrohttpd when the answer's head fits there, else straight to the socket, and the
    /// connection is closed (`AnswerRoom`, `DirectAnswer`).
    private func refuseHeadTooLarge(_ connection: OpaquePointer, room: Int, method: UnsafePointer<CChar>)
        -> MHD_Result
    {
        let response = handler.refusal(.headTooLarge)
        let answer = DirectAnswer(response, withBody: strcmp(method, "HEAD") != 0)
        if answer.head.count + AnswerRoom.margin <= room { return queue(response, on: connection, nil) }
        answer.send(to: CMicroHTTPD_connection_fd(connection))
        return CMicroHTTPD_no()
    }

    /// Carries out a handler's reply: queue it, or suspend the connection until the responder
    /// answers. A deferred reply takes one of the waiting places first, which the responder gives
    /// back when the wait ends (`HTTPResponder.waitEnded`); with none free, it is refused at once
    /// (`ServerRefusal.tooManyWaiting`), and its `start` never runs.
    private func reply(
        _ reply: HTTPReply, path: String, head: Bool, _ connection: OpaquePointer, streaming: Bool,
        state: () -> RequestState
    ) -> MHD_Result {
        switch reply {
        case .response(let response):
            return queue(response, on: connection, nil)
        case .deferred(let start):
            guard waitingPlaces.take() else {
                if streaming {
                    // Answered before its body, as `BodyHandling.refuse` is: what still comes of
                    // it is read into the request's capped buffer and dropped, not into the stream.
                    let state = state()
                    state.bodyStream?.close()
                    state.bodyStream = nil
                }
                let refusal = handler.refusal(.tooManyWaiting(path: path, places: waitingPlaces.limit))
                return queue(refusal, on: connection, nil)
            }
            // From here the place is given back once, when the wait ends: answered (also at once,
            // from `start`), hung up, or the request ended unanswered (`completed`; so it is for
            // one the server refuses to suspend below), whichever comes first.
            let responder = HTTPResponder(
                connection: connection, fd: CMicroHTTPD_connection_fd(connection), server: self,
                holdsWaitingPlace: true, answersHead: head)
            let state = state()
            state.responder = responder
            state.bodyStream?.attach(
                responder, clock: Self.clock(of: connection),
                drainMsec: Int64(configuration.connectionTimeoutSec) * 1000)
            // A streamed body keeps coming while the answer is prepared: the connection stays live.
            if !streaming {
                // Not once the server stopped: the handler's refusal, and no work begun. Not
                // reached while every daemon is quiesced on its own thread after `draining` is
                // set (checked just before `handle`); kept so that no path can suspend late.
                guard park(responder, connection) else { return queue(handler.refusal(.stopped), on: connection, nil) }
                watcher.watch(responder.fd, responder)
            }
            start(responder)
            return CMicroHTTPD_yes()
        }
    }

    /// `HTTP/1.x`'s x, from the version as libmicrohttpd passes it on: the request line's, as
    /// sent (`HTTP/`, a digit, a dot and a digit; it refuses any major but 1 before this); 1 for
    /// any other form.
    static func minorVersion(_ version: UnsafePointer<CChar>) -> UInt8 {
        guard strncmp(version, "HTTP/1.", 7) == 0 else { return 1 }
        let digit = UInt8(bitPattern: version[7])
        guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(digit), version[8] == 0 else { return 1 }
        return digit - UInt8(ascii: "0")
    }

    private func begin(
        _ state: RequestState, _ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>
    ) -> MHD_Result {
        let handler = handler
        if draining.load(ordering: .relaxed) { return queue(handler.refusal(.stopping), on: connection, nil) }
        var request = HTTPRequest(
            method: String(cString: method), path: String(cString: url), rawTarget: state.rawTarget,
            query: HTTPFields(connection, .GET_ARGUMENT_KIND), headers: HTTPFields(connection, .HEADER_KIND))
        request.minorVersion = Self.minorVersion(version)
        switch handler.begin(&request) {
        case .buffer(let limit):
            state.bodyLimit = limit
            state.head = request
            return CMicroHTTPD_yes()
        case .refuse(let response):
            return queue(response, on: connection, nil)
        case .stream(let body):
            // The body may take longer than the request deadline to arrive; its consumer paces it.
            Self.clock(of: connection)?.requestArrived()
            state.bodyStream = body
            request.bodyStream = body
            return reply(
                handler.handle(request), path: request.path, head: request.method == "HEAD", connection, streaming: true
            ) { state }
        }
    }

    private func queue(_ response: HTTPResponse, on connection: OpaquePointer, _ responder: HTTPResponder?)
        -> MHD_Result
    {
        if let stream = response.stream {
            stream.attach(
                responder
                    ?? HTTPResponder(connection: connection, fd: CMicroHTTPD_connection_fd(connection), server: self))
        }
        return MHD_queue_response(connection, UInt32(response.status), response.handle)
    }

    /// Suspends a connection and remembers it, so that shutting down can answer it; false,
    /// leaving it as it is, once the server has resumed its connections for the last time.
    private func park(_ responder: HTTPResponder, _ connection: OpaquePointer) -> Bool {
        guard suspended.withLock({ $0.insert(responder) }) else { return false }
        MHD_suspend_connection(connection)
        return true
    }

    /// Suspends a connection whose stream waits for bytes; false when the server is stopping.
    func suspendForStream(_ responder: HTTPResponder) -> Bool {
        guard !stopping.load(ordering: .relaxed) else { return false }
        return park(responder, responder.connection)
    }

    /// Resumes a suspended connection so the access handler can queue its answer.
    func resume(_ responder: HTTPResponder) {
        let (wasSuspended, trim) = suspended.withLock { suspended -> (Bool, Bool) in
            let removed = suspended.remove(responder)
            // Counted before the lock is let go, so that the stop sees it (`resumeAllForGood`).
            if removed { resumesUnderWay.add(1, ordering: .relaxed) }
            guard removed, suspended.count == 0, suspended.peak >= Self.trimAfterPeak else { return (removed, false) }
            suspended.peak = 0
            return (removed, true)
        }
        if wasSuspended {
            resumeConnection(responder)
            resumesUnderWay.subtract(1, ordering: .releasing)
        }
        if trim { watcher.requestMemoryTrim() }
    }

    /// `MHD_resume_connection` for a responder taken out of the suspended ones, and a wake-up
    /// for the thread that runs its daemon.
    private func resumeConnection(_ responder: HTTPResponder) {
        // The owner first: once resumed, the connection may be answered, closed and freed
        // by its daemon's thread before this one reads it again.
        let owner = CMicroHTTPD_connection_daemon(responder.connection)
        MHD_resume_connection(responder.connection)
        // A daemon in external mode learns of it only when its thread runs it next.
        if let owner {
            for thread in daemonThreads where thread.handle == owner { thread.wake() }
            for daemon in loopDaemons where daemon.handle == owner { daemon.source.markPending() }
        }
    }

    func completed(_ connection: OpaquePointer?, _ requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>) {
        if let connection, let clock = Self.clock(of: connection) { watcher.answered(clock) }
        let phase = RequestPhase(requestContext.pointee)
        if case .awaitingHead = phase { return }
        requestContext.pointee = nil
        requestsInFlight.subtract(1, ordering: .relaxed)
        guard let state = phase.state else { return }
        // The context's reference to the state, given back once the state is no longer needed.
        defer { Unmanaged.passUnretained(state).release() }
        if let responder = state.responder {
            // Normally resumed (and so forgotten) already; the lock is taken only when not.
            if responder.suspendedSlot.load(ordering: .relaxed) >= 0 {
                suspended.withLock { _ = $0.remove(responder) }
            }
            // An answer given while the request waited and never queued: libmicrohttpd 0.9.75
            // takes a resumed connection as ready to read and reads it before it asks for the
            // answer (unless the connection is its daemon's idle longest, which it looks at
            // first), and on a client's half-close (the end of its side: `clientHungUp`'s
            // `clientClosed` answer, or any answer given as it half-closed) closes the connection
            // instead. Its socket is still open here: the answer goes to it straight, as
            // libmicrohttpd would have written it on a connection it then closes.
            if let answer = responder.takeAnswer(), answer.stream == nil {
                DirectAnswer(answer, withBody: !responder.answersHead).send(to: responder.fd)
            }
            responder.connectionClosed()
        }
    }
}

extension HTTPServer {
    /// A connection opened or closed: its `ConnectionClock` lives in the socket context between the two.
    func connectionChanged(
        _ connection: OpaquePointer, socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>, opened: Bool
    ) {
        if opened {
            let clock = ConnectionClock(fd: CMicroHTTPD_connection_fd(connection))
            socketContext.pointee = Unmanaged.passRetained(clock).toOpaque()
            watcher.opened(clock)
        } else if let context = socketContext.pointee {
            socketContext.pointee = nil
            watcher.closed(Unmanaged<ConnectionClock>.fromOpaque(context).takeRetainedValue())
        }
    }

    /// A request line was read (`uri`: its target as sent; nil: none): its target is measured
    /// for the head's check, and requests under the streaming prefix get their state now, with
    /// the target as sent. Others get nothing.
    func requestTarget(_ uri: UnsafePointer<CChar>?, _ connection: OpaquePointer) -> UnsafeMutableRawPointer? {
        let clock = Self.clock(of: connection)
        guard let uri else {
            clock?.targetRead(length: -1)
            clock?.targetSeen(upTo: nil)
            return nil
        }
        let measured = RequestTarget.measure(uri)
        clock?.targetRead(length: measured)
        let raw = configuration.streamingPrefix.flatMap { prefix in
            strncmp(uri, prefix, prefix.utf8.count) == 0 ? String(cString: uri) : nil
        }
        // Only with a clock to note it on: the head is then refused, not served without its query.
        let most = RequestTarget.mostQueryArguments(
            memory: configuration.connectionMemoryLimit, targetLength: measured >= 0 ? measured : strlen(uri))
        if let clock {
            let (cut, seenUpTo) = RequestTarget.cutQuery(UnsafeMutablePointer(mutating: uri), most: most)
            if cut == .tooManyArguments { clock.targetRead(length: RequestTarget.queryCut) }
            clock.targetSeen(upTo: seenUpTo)
        }
        guard let raw else { return nil }
        let state = RequestState()
        state.rawTarget = raw
        requestsInFlight.add(1, ordering: .relaxed)
        return RequestPhase.targetRead(state).retainingContext
    }

    /// libmicrohttpd decodes the path or a query argument's name or value, in place, at `value`.
    ///
    /// One lying past what the request-line callback saw of the target (`RequestTarget.cutQuery`)
    /// is an argument behind a NUL sent raw that was followed, like the target's end, by
    /// `HTTP/1.1` and a NUL: the target is refused anyway, but libmicrohttpd may be unable to
    /// answer (its arguments, past the view, were not counted), and would hang until the
    /// connection's timeout. So the refusal (400) is sent now, straight to the socket, which is
    /// then shut down: libmicrohttpd sees it end and closes the connection.
    func unescaping(_ value: UnsafeMutablePointer<CChar>, _ connection: OpaquePointer) {
        guard let clock = Self.clock(of: connection), clock.readsPastTarget(value) else { return }
        // The method is not known yet: the body goes too, even to HEAD, on a connection that then ends.
        DirectAnswer(handler.refusal(.malformedHead(RequestTarget.nulProblem)), withBody: true).send(to: clock.fd)
        shutdown(clock.fd, Int32(SHUT_RDWR))
    }

    private static func clock(of connection: OpaquePointer) -> ConnectionClock? {
        CMicroHTTPD_socket_context(connection).map { Unmanaged<ConnectionClock>.fromOpaque($0).takeUnretainedValue() }
    }
}
