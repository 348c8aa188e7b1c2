internal import CCurl
import Dispatch
import Glibc
import Synchronization
import TokenBrokerCore

/// One `curl_multi` loop on a thread of its own: the transfers given to it, from the easy
/// handle's set-up to the answer handed over.
///
/// Each turn runs `curl_multi_perform`, then waits in `curl_multi_poll`, which
/// `curl_multi_wakeup` ends. (Driving libcurl through `curl_multi_socket_action` and an epoll
/// set of the loop's own was tried and taken out: with it, an upstream that answers and resets
/// the connection while a request body is still being sent lost its answer to a failed write in
/// up to one exchange in six, where this way libcurl's own poll of the socket reads it first in
/// almost every case, as the single loop before did.)
///
/// Other threads only queue work (a transfer, a command for a running exchange, a transfer whose
/// caller gave up) and wake the loop, and only when the list they add to was empty: a loop that
/// has not yet taken what was there will take theirs in the same turn, so one wake-up serves a
/// burst of requests.
///
/// A streamed answer's head is held until the end of the turn in which it came, with the bytes
/// of body that came in that turn: an answer that came whole in one turn is handed over whole,
/// and a longer one starts streaming at the end of its first turn, never later.
///
/// The loop is also an `EventLoopHost`: other libraries' sources (the token listener's
/// libmicrohttpd daemons, when proxies are configured) are polled in the same `curl_multi_poll`,
/// as extra descriptors, and run on this thread. A proxied request is then read, sent upstream,
/// and answered by one thread, with no hand-over between threads.
///
/// Locks: `queue`, `abandoned`, `commands` and `tasks` are each taken alone, never one inside
/// another.
// Unchecked: `multi` and `thread` are set in `init` and `start`, before any other thread sees the
// loop; everything else that changes is behind a lock or touched by the loop's thread alone.
final class CurlLoop: EventLoopHost, @unchecked Sendable {
    enum Command { case resumeReceiving, resumeSending, cancel }

    let multi: UnsafeMutableRawPointer
    private let queue = Lock<[Transfer]>([])
    /// Buffered requests whose caller gave up: stopped at the loop's next turn.
    private let abandoned = Lock<[Transfer]>([])
    /// Work on exchanges already running: unpause, or cancel.
    private let commands = Lock<[(UpstreamExchange, Command)]>([])
    /// Work other threads run on this one (`runOnLoop`): attaching and detaching sources.
    private let tasks = Lock<[@Sendable () -> Void]>([])
    private var thread = pthread_t()
    private let started = Atomic<Bool>(false)

    // The loop thread's own state.
    private var active: [UnsafeMutableRawPointer: Transfer] = [:]
    private var streamed: [ObjectIdentifier: Transfer] = [:]
    /// The sources polled besides libcurl's sockets, each with when it must run at the latest
    /// and whether it is due this turn.
    private var sources: [(source: EventLoopSource, deadline: Int64, due: Bool)] = []
    /// Set while the sources' work runs; a turn always follows.
    private var runningSources = false
    /// Streamed transfers whose head came in this turn and waits for its end.
    fileprivate var heldHeads: [Transfer] = []
    /// The TLS files' bytes, read again when they change.
    private let tlsFiles = TLSFileCache()
    /// Easy handles of transfers that ended cleanly, reset for the next ones (`release`).
    private var spareHandles: [UnsafeMutableRawPointer] = []
    /// The most spare handles kept: a burst's worth; past it, handles are freed.
    static let spareHandleLimit = 64
    /// The most body held with a head before the head is handed over anyway.
    static let heldBodyLimit = 64 * 1024

    /// Nil when libcurl could not make or set up a multi handle; `problem` says why.
    init?(problem: inout String) {
        guard let multi = curl_multi_init() else {
            problem = "libcurl could not create its multi handle"
            return nil
        }
        // Idle connections kept for reuse: libcurl's default follows the handles added at the
        // time, and closes connections a busy proxy would have reused a moment later.
        guard CCurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 256) == CURLM_OK else {
            problem = "libcurl refused the multi handle's connection cache size"
            curl_multi_cleanup(multi)
            return nil
        }
        self.multi = multi
    }

    /// Starts the loop's thread; returns why it could not, or nil.
    func start() -> String? {
        let status = SystemThread.start(&thread) { [self] in run() }
        guard status != 0 else {
            started.store(true, ordering: .releasing)
            return nil
        }
        return "cannot start the HTTP client's thread: \(String(cString: strerror(status)))"
    }

    // MARK: - From any thread

    func enqueue(_ transfer: Transfer) { add(transfer, to: queue) }

    func abandon(_ transfer: Transfer) {
        transfer.givenUp.store(true, ordering: .relaxed)
        add(transfer, to: abandoned)
    }

    func post(_ command: Command, for exchange: UpstreamExchange) { add((exchange, command), to: commands) }

    private func add<Item>(_ item: Item, to list: Lock<[Item]>) {
        let wasEmpty = list.withLock { items in
            items.append(item)
            return items.count == 1
        }
        // Queued by a source's work, on the loop's own thread: the turn that follows it takes
        // the item, so no wake-up (`isCurrent` first: the flag is the loop thread's alone).
        if wasEmpty, !(isCurrent && runningSources) { curl_multi_wakeup(multi) }
    }

    /// Whether the calling thread is this loop's.
    var isCurrent: Bool { pthread_equal(pthread_self(), thread) != 0 }

    // MARK: - EventLoopHost

    func runOnLoop(_ work: @escaping @Sendable () -> Void) {
        guard !isCurrent else { return work() }
        precondition(started.load(ordering: .acquiring), "runOnLoop on a loop that never started")
        let done = DispatchSemaphore(value: 0)
        add(
            {
                work()
                done.signal()
            }, to: tasks)
        done.wait()
    }

    func attach(_ source: EventLoopSource) {
        runOnLoop { [self] in sources.append((source, 0, true)) }
    }

    func detach(_ source: EventLoopSource) {
        precondition(isCurrent, "detach runs on the loop's thread")
        sources.removeAll { $0.source === source }
    }

    func wake() { curl_multi_wakeup(multi) }

    // MARK: - The loop's thread

    private func run() {
        var waits: [curl_waitfd] = []
        while true {
            turn()
            if runDueSources() { turn() }
            // The sources' descriptors are polled with libcurl's sockets; the wait ends at the
            // earliest source's timeout, at once when one is pending.
            waits.removeAll(keepingCapacity: true)
            var timeout: Int32 = 1000
            let now = Self.milliseconds()
            for index in sources.indices {
                let source = sources[index].source
                let wait = source.isPending ? 0 : min(max(source.timeoutMilliseconds, 0), 1000)
                sources[index].deadline = now + Int64(wait)
                timeout = min(timeout, wait)
                waits.append(curl_waitfd(fd: source.descriptor, events: Int16(CURL_WAIT_POLLIN), revents: 0))
            }
            // A poll that fails (out of memory) returns at once: pause rather than spin.
            if curl_multi_poll(multi, &waits, UInt32(waits.count), timeout, nil) != CURLM_OK { usleep(10_000) }
            let after = Self.milliseconds()
            for index in sources.indices {
                sources[index].due = waits[index].revents != 0 || after >= sources[index].deadline
            }
        }
    }

    /// Runs the sources whose descriptor was ready, whose timeout ended or that are pending;
    /// true when one ran (its work may have queued transfers for this loop).
    private func runDueSources() -> Bool {
        runningSources = true
        defer { runningSources = false }
        var ran = false
        // A source's work cannot attach or detach one (that is a task, run in `turn`).
        for index in sources.indices where sources[index].due || sources[index].source.isPending {
            sources[index].due = false
            sources[index].source.run()
            ran = true
        }
        return ran
    }

    private static func milliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }

    /// One turn of the loop's own work: what other threads queued, then libcurl's transfers.
    private func turn() {
        for task in take(tasks) { task() }
        for transfer in take(queue) { begin(transfer) }
        for (exchange, command) in take(commands) {
            guard let transfer = streamed[ObjectIdentifier(exchange)], let easy = transfer.easy else { continue }
            switch command {
            case .resumeReceiving, .resumeSending:
                curl_easy_pause(easy, CURLPAUSE_CONT)
            case .cancel:
                active.removeValue(forKey: easy)
                streamed.removeValue(forKey: ObjectIdentifier(exchange))
                stop(transfer, easy)
            }
        }
        for transfer in take(abandoned) {
            guard let easy = transfer.easy, active[easy] === transfer else { continue }  // finished already
            active.removeValue(forKey: easy)
            stop(transfer, easy)
        }
        var running: Int32 = 0
        curl_multi_perform(multi, &running)
        collectFinished()
    }

    /// Ends the transfers libcurl says are done, then hands over the heads held in this turn.
    private func collectFinished() {
        var left: Int32 = 0
        while let message = curl_multi_info_read(multi, &left) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle,
                let transfer = active.removeValue(forKey: easy)
            else { continue }
            let result = CCurl_message_result(message)
            curl_multi_remove_handle(multi, easy)
            if let exchange = transfer.exchange { streamed.removeValue(forKey: ObjectIdentifier(exchange)) }
            finish(transfer, result)
        }
        for transfer in heldHeads where transfer.easy != nil && !transfer.headDelivered {
            deliverHead(transfer, complete: false)
        }
        heldHeads.removeAll(keepingCapacity: true)
    }

    private func take<Item>(_ list: Lock<[Item]>) -> [Item] {
        list.withLock { items in
            defer { items = [] }
            return items
        }
    }

    private func begin(_ transfer: Transfer) {
        // Given up, or cancelled, before it started: a turn may take the queue just before the
        // transfer is added and the list of abandoned ones (or of commands) just after, and the
        // transfer would otherwise start with nobody waiting for it.
        if transfer.givenUp.load(ordering: .relaxed)
            || transfer.exchange?.cancelRequested.load(ordering: .relaxed) == true
        {
            notStarted(transfer, .stopped)
            return
        }
        if let problem = prepare(transfer) {
            notStarted(transfer, problem)
            return
        }
        let added = curl_multi_add_handle(multi, transfer.easy)
        guard added == CURLM_OK else {
            release(transfer)
            notStarted(
                transfer,
                .clientFailure("libcurl could not start the request: \(String(cString: curl_multi_strerror(added)))"))
            return
        }
        active[transfer.easy!] = transfer
        if let exchange = transfer.exchange { streamed[ObjectIdentifier(exchange)] = transfer }
    }

    /// A transfer that could not be started: its waiter or its exchange learns why.
    private func notStarted(_ transfer: Transfer, _ problem: UpstreamError) {
        if let exchange = transfer.exchange {
            exchange.delegate.upstreamFinished(problem)
        } else {
            transfer.continuation?.resume(throwing: problem)
        }
    }

    /// Stops a running transfer on purpose (cancelled, or its caller gave up): its connection is
    /// closed, never reused, and its waiter or exchange is finished.
    private func stop(_ transfer: Transfer, _ easy: UnsafeMutableRawPointer) {
        Self.forbidReuse(easy)
        curl_multi_remove_handle(multi, easy)
        transfer.cancelled = true
        finish(transfer, CURLE_ABORTED_BY_CALLBACK)
    }

    /// Sets up the easy handle, a spare one if there is one; returns an error instead when the
    /// request cannot be sent.
    private func prepare(_ transfer: Transfer) -> UpstreamError? {
        let request = transfer.request
        let settings = request.settings
        let caFile: [UInt8]?
        let clientCertificate: [UInt8]?
        let clientKey: [UInt8]?
        do {
            caFile = try tlsFile("caFile", settings.caFile, limit: UpstreamConfiguration.caFileLimit)
            clientCertificate = try tlsFile(
                "clientCertFile", settings.clientCertFile, limit: UpstreamConfiguration.clientFileLimit)
            clientKey = try tlsFile(
                "clientKeyFile", settings.clientKeyFile, limit: UpstreamConfiguration.clientFileLimit)
        } catch {
            return error
        }
        guard let easy = spareHandles.popLast() ?? curl_easy_init() else {
            return .clientFailure("curl_easy_init failed")
        }
        transfer.easy = easy
        transfer.loop = self
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        var ok = true
        func set(_ code: CURLcode) { ok = ok && code == CURLE_OK }
        // Through `withCString`: passed straight as an argument, a short string (15 bytes or
        // fewer, such as a method) is first copied to a new array on the heap.
        func set(_ option: CURLoption, _ text: String) {
            text.withCString { set(CCurl_setopt_string(easy, option, $0)) }
        }
        func set(_ option: CURLoption, _ bytes: [UInt8]) {
            bytes.withUnsafeBytes { set(CCurl_setopt_blob(easy, option, $0.baseAddress, $0.count)) }
        }
        set(CURLOPT_URL, request.url)
        set(CURLOPT_PROTOCOLS_STR, "http,https")
        set(CCurl_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        set(CCurl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0))
        set(CCurl_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1))
        set(CCurl_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2))
        set(CCurl_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, settings.connectTimeoutMsec))
        set(CCurl_setopt_long(easy, CURLOPT_TIMEOUT_MS, settings.timeoutMsec))
        if let socket = request.unixSocketPath { set(CURLOPT_UNIX_SOCKET_PATH, socket) }
        if request.bypassesProxies { set(CURLOPT_NOPROXY, "*") }
        // The TLS files go to libcurl as the bytes read above (`TLSFileCache`), never as paths
        // that libcurl would open itself, waiting on a FIFO. libcurl keeps no CA store made from
        // bytes (CURLOPT_CA_CACHE_TIMEOUT is for a CA file), and reuses neither a kept connection
        // nor a TLS session set up with other CA or certificate bytes: a replaced file is used
        // from the next request on. (Given the same path, libcurl resumed the session made with
        // the file before, and the new CAs were never asked.)
        if let caFile {
            set(CURLOPT_CAINFO_BLOB, caFile)
            // The file's CAs in place of the system's, not beside them: Debian's libcurl is built
            // with a CA directory (/etc/ssl/certs) that stays in force beside the CAs given until
            // it is unset (the bytes do replace its CA bundle, CURLOPT_CAINFO).
            set(CCurl_setopt_string(easy, CURLOPT_CAPATH, nil))
        }
        if let clientCertificate { set(CURLOPT_SSLCERT_BLOB, clientCertificate) }
        if let clientKey {
            set(CURLOPT_SSLKEY_BLOB, clientKey)
            // An empty pass phrase, so that a key replaced by an encrypted one since it was
            // checked fails the connection: without one, OpenSSL would ask the terminal, and this
            // thread would wait there for ever.
            set(CURLOPT_KEYPASSWD, "")
        }
        set(CURLOPT_CUSTOMREQUEST, request.method)
        if request.method == "HEAD" {
            set(CCurl_setopt_long(easy, CURLOPT_NOBODY, 1))
        } else if let exchange = transfer.exchange, exchange.streamsBody {
            // The body is read from the exchange as it arrives from the client.
            set(CCurl_setopt_long(easy, CURLOPT_UPLOAD, 1))
            if let length = exchange.bodyLength { set(CCurl_setopt_long(easy, CURLOPT_INFILESIZE_LARGE, length)) }
            set(CCurl_setopt_read_function(easy, readCallback))
            set(CCurl_setopt_pointer(easy, CURLOPT_READDATA, context))
        } else if request.method == "GET" && request.body.isEmpty {
            set(CCurl_setopt_long(easy, CURLOPT_HTTPGET, 1))
        } else if transfer.exchange != nil,
            Self.sendsOnce(request.method) || (request.method == "PUT" && request.body.isEmpty)
        {
            // A proxied POST or PATCH must not reach the upstream twice (RFC 9110 §9.2.2), and
            // libcurl sends a request again, on a new connection, when a reused one closes
            // before any answer (7.88 has no CURLOPT_FORBID_RETRY_ON_REUSE): after an upstream
            // that acted on it and closed, too. So the body is handed over by a read callback
            // with no way back (no CURLOPT_SEEKFUNCTION): once any of it was sent, libcurl
            // cannot rewind, and the exchange fails (502) instead of sending it again. A request
            // with no body has nothing to rewind, so it takes a new connection, where libcurl
            // never retries. As an upload, an empty POST, PUT or PATCH says `Content-Length: 0`
            // (RFC 9110 §8.6), as its client did. A PUT with a body is idempotent: it goes below,
            // as a DELETE does, and libcurl may send it again.
            set(CCurl_setopt_long(easy, CURLOPT_UPLOAD, 1))
            set(CCurl_setopt_long(easy, CURLOPT_INFILESIZE_LARGE, request.body.count))
            set(CCurl_setopt_read_function(easy, onceReadCallback))
            set(CCurl_setopt_pointer(easy, CURLOPT_READDATA, context))
            if request.body.isEmpty, Self.sendsOnce(request.method) {
                set(CCurl_setopt_long(easy, CURLOPT_FRESH_CONNECT, 1))
            }
        } else if request.body.isEmpty && transfer.exchange != nil {
            // DELETE, OPTIONS and the like without a body: the method alone.
        } else {
            // libcurl reads the body from this copy while the transfer runs; `release` frees it.
            let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: request.body.count, alignment: 1)
            request.body.withUnsafeBytes { copy.copyMemory(from: $0) }
            transfer.bodyCopy = copy
            set(CCurl_setopt_long(easy, CURLOPT_POSTFIELDSIZE, request.body.count))
            set(CCurl_setopt_pointer(easy, CURLOPT_POSTFIELDS, copy.baseAddress))
        }
        if transfer.exchange != nil {
            // Proxied answers may be large: read them in pieces of up to 64 KiB rather than 16,
            // so that most come whole in one turn.
            set(CCurl_setopt_long(easy, CURLOPT_BUFFERSIZE, Self.heldBodyLimit))
        }
        for (name, value) in request.headers { ok = ok && Self.append(name, value, to: &transfer.headerList) }
        // libcurl would add "Expect: 100-continue" to uploads (every streamed body) and to POSTs over
        // 1 MiB; nobody here gains from it.
        for name in request.withheld { ok = ok && Self.withhold(name, from: &transfer.headerList) }
        ok = ok && Self.withhold("Expect", from: &transfer.headerList)
        set(CCurl_setopt_pointer(easy, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(transfer.headerList)))
        set(CCurl_setopt_write_function(easy, bodyCallback))
        set(CCurl_setopt_pointer(easy, CURLOPT_WRITEDATA, context))
        set(CCurl_setopt_header_function(easy, headerCallback))
        set(CCurl_setopt_pointer(easy, CURLOPT_HEADERDATA, context))
        guard ok else {
            release(transfer)
            return .settingsRefused
        }
        return nil
    }

    /// A TLS file's bytes for libcurl (`TLSFileCache`), nil when there is no such setting; a file
    /// that cannot be read now (gone, no regular file any more, too large) fails the exchange, naming
    /// the setting and the path.
    private func tlsFile(_ setting: String, _ path: String?, limit: Int) throws(UpstreamError) -> [UInt8]? {
        guard let path else { return nil }
        switch tlsFiles.contents(of: path, limit: limit) {
        case .success(let bytes): return bytes
        case .failure(let error): throw .unreadableFile("\(setting): cannot read \(path): \(error.reason)")
        }
    }

    /// Adds the line `name: value` to a request's header list; the value is the bytes to send, and
    /// may be empty (given to libcurl as `name;`, its form for a header without a value: `name:`
    /// would withhold the header). A name or value that holds CR or LF, which would start a line
    /// of its own, or NUL, which would cut the line short, is left out. False only when libcurl
    /// could not add the line (out of memory); the list is then unchanged.
    ///
    /// The line is put together in a temporary buffer, not as a Swift string: every proxied
    /// request sends several headers, one of them the token.
    static func append(_ name: String, _ value: [UInt8], to list: inout UnsafeMutablePointer<curl_slist>?) -> Bool {
        value.withUnsafeBufferPointer { value in line(name, value.isEmpty ? ";" : ": ", value, to: &list) }
    }

    /// Keeps libcurl from sending a header it would add of its own accord (`name:`).
    static func withhold(_ name: String, from list: inout UnsafeMutablePointer<curl_slist>?) -> Bool {
        line(name, ":", UnsafeBufferPointer(start: nil, count: 0), to: &list)
    }

    /// Adds `name`, `separator` and `value` as one line, unless the name or value holds CR, LF or NUL.
    private static func line(
        _ name: String, _ separator: StaticString, _ value: UnsafeBufferPointer<UInt8>,
        to list: inout UnsafeMutablePointer<curl_slist>?
    ) -> Bool {
        var name = name
        return name.withUTF8 { name in
            if breaksLine(name) || breaksLine(value) { return true }
            let middle = separator.utf8CodeUnitCount
            let length = name.count + middle + value.count
            return withUnsafeTemporaryAllocation(of: CChar.self, capacity: length + 1) { line in
                guard let first = line.baseAddress else { return false }
                let start = UnsafeMutableRawPointer(first)
                if let bytes = name.baseAddress { start.copyMemory(from: bytes, byteCount: name.count) }
                (start + name.count).copyMemory(from: separator.utf8Start, byteCount: middle)
                if let bytes = value.baseAddress {
                    (start + name.count + middle).copyMemory(from: bytes, byteCount: value.count)
                }
                line[length] = 0
                guard let appended = curl_slist_append(list, line.baseAddress) else { return false }
                list = appended
                return true
            }
        }
    }

    /// Whether a header's name or value holds CR, LF or NUL (`memchr`: a token is hundreds of bytes).
    private static func breaksLine(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let start = bytes.baseAddress else { return false }
        return memchr(start, Int32(UInt8(ascii: "\r")), bytes.count) != nil
            || memchr(start, Int32(UInt8(ascii: "\n")), bytes.count) != nil || memchr(start, 0, bytes.count) != nil
    }

    private func finish(_ transfer: Transfer, _ result: CURLcode) {
        defer {
            let clean = result == CURLE_OK && !transfer.cancelled && !transfer.paused
            release(transfer, reusable: clean && transfer.exchange?.stoppedOnPurpose != true)
        }
        if let exchange = transfer.exchange {
            finishStreamed(transfer, exchange, result)
            return
        }
        guard let continuation = transfer.continuation else { return }
        // Stopped by the header callback: the head cannot be read as it came.
        if let problem = transfer.unpassable {
            continuation.resume(throwing: UpstreamError.badResponse(problem))
            return
        }
        guard result == CURLE_OK else {
            let reason = String(cString: curl_easy_strerror(result))
            switch result {
            case CURLE_WRITE_ERROR where transfer.tooLarge:
                continuation.resume(throwing: UpstreamError.tooLarge(limit: transfer.request.settings.maxResponseBytes))
            case CURLE_OPERATION_TIMEDOUT:
                continuation.resume(throwing: UpstreamError.timeout(reason))
            case _ where transfer.cancelled:
                continuation.resume(throwing: UpstreamError.stopped)
            default:
                if let problem = Self.malformedAnswer(result, transfer.easy) {
                    continuation.resume(throwing: UpstreamError.badResponse(problem))
                } else {
                    continuation.resume(throwing: UpstreamError.unreachable(reason))
                }
            }
            return
        }
        var status = 0
        _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
        continuation.resume(
            returning: UpstreamResponse(status: status, headers: transfer.headers, body: transfer.body))
    }

    private func finishStreamed(_ transfer: Transfer, _ exchange: UpstreamExchange, _ result: CURLcode) {
        // Stopped by the header callback: the head is not handed over, the answer is the broker's.
        if let problem = transfer.unpassable {
            exchange.delegate.upstreamFinished(.badResponse(problem))
            return
        }
        // A head still held is handed over first: whole, or (the transfer failed) with what came of the body.
        if transfer.headReady, !transfer.headDelivered, !transfer.cancelled {
            deliverHead(transfer, complete: result == CURLE_OK)
        }
        switch result {
        case CURLE_OK:
            if !transfer.headDelivered { deliverHead(transfer, complete: true) }
            exchange.delegate.upstreamFinished(nil)
        case CURLE_OPERATION_TIMEDOUT:
            exchange.delegate.upstreamFinished(.timeout(String(cString: curl_easy_strerror(result))))
        case _ where transfer.cancelled || exchange.stoppedOnPurpose:
            exchange.delegate.upstreamFinished(.stopped)
        default:
            if let problem = Self.malformedAnswer(result, transfer.easy) {
                exchange.delegate.upstreamFinished(.badResponse(problem))
            } else {
                exchange.delegate.upstreamFinished(.unreachable(String(cString: curl_easy_strerror(result))))
            }
        }
    }

    /// What libcurl's failure says of an answer that came but is not HTTP as a server speaks it,
    /// in the client's words (a `badResponse`); nil for any other failure. The codes, as libcurl
    /// 7.88 gives them for answers a raw socket sent (Tests/integration): a garbage status line,
    /// another version, a code out of range or none at all (HTTP/0.9) are
    /// CURLE_UNSUPPORTED_PROTOCOL; a header line without a colon, a NUL or a Content-Length that
    /// is no number, CURLE_WEIRD_SERVER_REPLY; a header line over its 100 KiB,
    /// CURLE_OUT_OF_MEMORY; a transfer coding it cannot decode, CURLE_BAD_CONTENT_ENCODING. Only
    /// once the request went out: before that, the same codes mean a URL libcurl does not speak
    /// (`file://`) or memory it could not have.
    private static func malformedAnswer(_ result: CURLcode, _ easy: UnsafeMutableRawPointer?) -> String? {
        var sent = 0
        guard CCurl_getinfo_long(easy, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK, sent > 0 else { return nil }
        switch result {
        case CURLE_UNSUPPORTED_PROTOCOL:
            return "the answer has no HTTP/1 status line (garbage, another version or code, or none: HTTP/0.9)"
        case CURLE_WEIRD_SERVER_REPLY:
            return "the answer's head is not HTTP (a line without a colon, a NUL, a Content-Length that is no number)"
        case CURLE_OUT_OF_MEMORY:
            return "a line of the answer's head is longer than libcurl takes (100 KiB), or libcurl ran out of memory"
        case CURLE_BAD_CONTENT_ENCODING:
            return "the answer's transfer coding cannot be decoded"
        default:
            return nil
        }
    }

    /// Hands the final answer's head over, once, with the body held since it came.
    fileprivate func deliverHead(_ transfer: Transfer, complete: Bool) {
        guard let exchange = transfer.exchange else { return }
        transfer.headDelivered = true
        var status = 0
        _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
        var length: curl_off_t = -1
        _ = CCurl_getinfo_offset(transfer.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length)
        let accepted = transfer.held.withUnsafeBytes {
            exchange.delegate.upstreamHead(
                status: status, headers: transfer.headerLines, length: length >= 0 ? Int64(length) : nil,
                body: $0, complete: complete)
        }
        transfer.held = []
        if !accepted {
            // Writing nothing then fails the transfer, and libcurl closes a failed transfer's connection.
            exchange.stoppedOnPurpose = true
        }
    }

    /// Closes the transfer's connection when it ends instead of keeping it for the next request:
    /// after an exchange that did not end cleanly, what the upstream has read of it is unknown,
    /// and a later request on that connection could be read as part of it.
    static func forbidReuse(_ easy: UnsafeMutableRawPointer?) {
        _ = CCurl_setopt_long(easy, CURLOPT_FORBID_REUSE, 1)
    }

    /// Frees the transfer's libcurl resources. The easy handle of one that ended cleanly
    /// (`reusable`) is reset and kept for the next transfer, up to `spareHandleLimit`: making and
    /// freeing one cost about 16,000 instructions a proxied request (callgrind), an eighth of
    /// them clearing its memory, and its 64 KiB buffer came from the allocator every time.
    ///
    /// Only a transfer never paused, cancelled or stopped on purpose leaves a handle to keep:
    /// `curl_easy_reset` resets the options, and a pause or an abort may be state that outlives
    /// it. An earlier attempt that kept every handle, whatever its transfer's end, made transfers
    /// hang in 2 runs of the unit tests in 6 on libcurl 7.88; with this rule, 8 runs in a row
    /// passed.
    /// Methods that are not idempotent (RFC 9110 §9.2.2), among those the proxy forwards: sent
    /// upstream at most once.
    static func sendsOnce(_ method: String) -> Bool { method == "POST" || method == "PATCH" }

    private func release(_ transfer: Transfer, reusable: Bool = false) {
        if reusable, let easy = transfer.easy, spareHandles.count < Self.spareHandleLimit {
            curl_easy_reset(easy)
            spareHandles.append(easy)
        } else {
            curl_easy_cleanup(transfer.easy)
        }
        curl_slist_free_all(transfer.headerList)
        transfer.bodyCopy?.deallocate()
        transfer.easy = nil
        transfer.headerList = nil
        transfer.bodyCopy = nil
    }

    // MARK: - What libcurl's callbacks do

    fileprivate static func appendBody(_ transfer: Transfer, _ data: UnsafeRawBufferPointer) -> Int {
        if let exchange = transfer.exchange {
            if exchange.stoppedOnPurpose { return 0 }
            if !transfer.headDelivered {
                guard transfer.held.count + data.count > heldBodyLimit, let loop = transfer.loop else {
                    transfer.held.append(contentsOf: data)
                    return data.count
                }
                loop.deliverHead(transfer, complete: false)
                if exchange.stoppedOnPurpose { return 0 }
            }
            guard exchange.delegate.upstreamBody(data) else {
                transfer.paused = true
                return Int(CURL_WRITEFUNC_PAUSE)
            }
            return data.count
        }
        guard transfer.body.count + data.count <= transfer.request.settings.maxResponseBytes else {
            transfer.tooLarge = true
            return 0
        }
        transfer.body.append(contentsOf: data)
        return data.count
    }

    /// The most header lines of an answer passed on; an answer with more is refused
    /// (`badResponse`) rather than passed on without some of them.
    static let headerLineLimit = 200

    fileprivate static func appendHeader(_ transfer: Transfer, _ line: UnsafeRawBufferPointer) -> Int {
        guard let header = HeaderLine(line) else { return line.count }
        switch header {
        case .statusLine where !transfer.headReady:
            // A new response (after 100 Continue): forget the interim one's headers.
            transfer.headers = [:]
            transfer.ambiguous = []
            transfer.headerLines = []
            transfer.contentLength = nil
        case .end:
            guard !transfer.headReady else { break }
            var status = 0
            _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
            guard transfer.exchange != nil else {
                // An issuer's answer: what comes after its head (a chunked body's trailers) is
                // none of its headers.
                if status >= 200 { transfer.headReady = true }
                break
            }
            // After a 101 the connection speaks another protocol, and the broker tunnels none
            // (RFC 9110 §15.2.2): libcurl, which asked for no upgrade, would read on as HTTP.
            if status == 101 { return refuse(transfer, "the target switched protocols (101)") }
            if status >= 200, let loop = transfer.loop {
                transfer.headReady = true
                loop.heldHeads.append(transfer)
            }
        case .statusLine:
            break
        case .continuation(let value):
            // obs-fold (RFC 9112 §5.2): each fold is replaced by one space. An issuer's answer is
            // read by name, not passed on, and loses the folded part.
            guard transfer.exchange != nil, !transfer.headReady else { break }
            guard !transfer.headerLines.isEmpty else { return refuse(transfer, "a folded line before any header") }
            if !value.isEmpty {
                transfer.headerLines[transfer.headerLines.count - 1].1.append(UInt8(ascii: " "))
                transfer.headerLines[transfer.headerLines.count - 1].1.append(contentsOf: value)
            }
        case .field(let name, let value):
            if transfer.exchange != nil {
                // A trailer after the head is no header of the answer.
                guard !transfer.headReady else { break }
                guard transfer.headerLines.count < headerLineLimit else {
                    return refuse(transfer, "more than \(headerLineLimit) headers")
                }
                if name.equalsIgnoringASCIICase("Content-Length"), !sameLength(transfer, value) {
                    // RFC 9112 §6.3 item 5: the answer cannot be framed; libcurl keeps the last.
                    return refuse(transfer, "different Content-Length values")
                }
                // Streamed exchanges pass every header on, in order, names as sent.
                if transfer.headerLines.isEmpty { transfer.headerLines.reserveCapacity(16) }
                transfer.headerLines.append((name, value))
            } else if !transfer.headReady {
                if name.equalsIgnoringASCIICase("Content-Length"), !sameLength(transfer, value) {
                    // RFC 9112 §6.3 item 5, as for a streamed answer: libcurl frames the body by the last.
                    return refuse(transfer, "different Content-Length values")
                }
                readField(transfer, name.lowercased(), String(decoding: value, as: UTF8.self))
            }
        }
        return line.count
    }

    /// An issuer's answer is read, not passed on: its values as text, by lower-case name, the
    /// first 100 names. A field sent again with the same value is that value; sent with another,
    /// which one the issuer meant is unknown, and the field is not read at all (a `Retry-After`
    /// then holds nothing off).
    private static func readField(_ transfer: Transfer, _ name: String, _ value: String) {
        guard !transfer.ambiguous.contains(name) else { return }
        if let earlier = transfer.headers[name] {
            guard earlier != value else { return }
            transfer.headers[name] = nil
            transfer.ambiguous.insert(name)
        } else if transfer.headers.count < 100 {
            transfer.headers[name] = value
        }
    }

    /// Stops a transfer at its head, which cannot be passed on (or, an issuer's, read) as it
    /// came: writing nothing fails the transfer, and libcurl closes a failed transfer's connection.
    private static func refuse(_ transfer: Transfer, _ problem: String) -> Int {
        if transfer.unpassable == nil { transfer.unpassable = problem }
        return 0
    }

    /// Whether every length in a `Content-Length` value (one, or a list of them) is the one the
    /// answer said first, which it then becomes if it is the first (RFC 9112 §6.3 item 5: a list
    /// of the same length frames the answer one way; different ones, none).
    private static func sameLength(_ transfer: Transfer, _ value: [UInt8]) -> Bool {
        for element in value.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false) {
            let length = element.trimmingHTTPBlanks()
            if let said = transfer.contentLength {
                guard said.elementsEqual(length) else { return false }
            } else {
                transfer.contentLength = Array(length)
            }
        }
        return true
    }
}

/// One line of an answer's head as libcurl hands it over, read byte by byte.
enum HeaderLine: Equatable {
    case statusLine
    /// The empty line that ends a head.
    case end
    /// A field: its name as sent, its value without surrounding blanks and line end, as the bytes
    /// sent (a proxied answer passes them on; obs-text, RFC 9110 §5.5, is no UTF-8).
    case field(String, [UInt8])
    /// A folded continuation of the field before (obs-fold, RFC 9112 §5.2: a line that starts
    /// with a space or tab): its bytes without the blanks around them and the line end.
    case continuation([UInt8])

    /// Nil for a line that is none of these (one without a colon).
    init?(_ line: UnsafeRawBufferPointer) {
        let cr = UInt8(ascii: "\r")
        let lf = UInt8(ascii: "\n")
        if line.count >= 5, line[0] == UInt8(ascii: "H"), line[1] == UInt8(ascii: "T"), line[2] == UInt8(ascii: "T"),
            line[3] == UInt8(ascii: "P"), line[4] == UInt8(ascii: "/")
        {
            self = .statusLine
            return
        }
        var end = line.count
        while end > 0, line[end - 1] == cr || line[end - 1] == lf { end -= 1 }
        if end == 0 {
            self = .end
            return
        }
        if line[0].isHTTPBlank {
            self = .continuation(Array(UnsafeRawBufferPointer(rebasing: line[line.trimmingHTTPBlanks(0..<end)])))
            return
        }
        guard let colon = line[..<end].firstIndex(of: UInt8(ascii: ":")) else { return nil }
        self = .field(
            String(decoding: UnsafeRawBufferPointer(rebasing: line[..<colon]), as: UTF8.self),
            Array(UnsafeRawBufferPointer(rebasing: line[line.trimmingHTTPBlanks(colon + 1..<end)])))
    }
}

/// One request in flight: its easy handle, what came back so far, and who waits.
///
/// - Important: only its loop's thread reads or changes it once queued; other threads only hand
///   the reference over, through the loop's locks.
final class Transfer: @unchecked Sendable {
    let request: UpstreamRequest
    /// A buffered request's waiter; nil for a streamed exchange.
    let continuation: CheckedContinuation<UpstreamResponse, any Error>?
    /// A streamed exchange; nil for a buffered request.
    let exchange: UpstreamExchange?
    /// The loop running it, once it runs.
    fileprivate unowned(unsafe) var loop: CurlLoop?
    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?
    var body: [UInt8] = []
    /// A buffered answer's headers, by lower-case name (`readField`).
    var headers: [String: String] = [:]
    /// Names a buffered answer gave more than one value, which are not read.
    var ambiguous: Set<String> = []
    /// Every header of the final answer, in order, names as sent and values as the bytes sent
    /// (streamed exchanges).
    var headerLines: [(String, [UInt8])] = []
    /// The final answer's `Content-Length`, as the first one said it.
    var contentLength: [UInt8]?
    /// Why the answer cannot be passed on (or read) as it came, once the header callback stopped
    /// the transfer for it: the exchange then ends with `badResponse`.
    var unpassable: String?
    var tooLarge = false
    /// The request body as libcurl reads it (buffered requests with a body), freed by `release`.
    var bodyCopy: UnsafeMutableRawBufferPointer?
    /// The final answer's head is complete: what comes after it (trailers) is no header of it.
    var headReady = false
    var headDelivered = false
    /// Body that came with a head not yet handed over.
    var held: [UInt8] = []
    var cancelled = false
    /// Set when a callback paused the transfer: its handle is not kept for another (`release`).
    var paused = false
    /// Set by `abandon`, from any thread: the caller gave up, so a transfer not yet started never starts.
    let givenUp = Atomic<Bool>(false)
    /// Bytes of a streamed request body, or of a buffered one sent once (`prepare`), handed to libcurl so far.
    var bodySent: Int64 = 0

    init(request: UpstreamRequest, continuation: CheckedContinuation<UpstreamResponse, any Error>) {
        self.request = request
        self.continuation = continuation
        exchange = nil
    }

    init(exchange: UpstreamExchange) {
        request = exchange.request
        continuation = nil
        self.exchange = exchange
    }

    static func from(_ context: UnsafeMutableRawPointer) -> Transfer {
        Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
    }
}

// Top-level C callbacks: they capture nothing and find the transfer through their context pointer.

private let bodyCallback: curl_write_callback = { data, size, count, context in
    guard let data, let context else { return 0 }
    return CurlLoop.appendBody(Transfer.from(context), UnsafeRawBufferPointer(start: data, count: size * count))
}

private let headerCallback: curl_write_callback = { data, size, count, context in
    guard let data, let context else { return 0 }
    return CurlLoop.appendHeader(Transfer.from(context), UnsafeRawBufferPointer(start: data, count: size * count))
}

// A buffered body that must not be sent twice (`prepare`), read from the request in order and
// never from its start again.
private let onceReadCallback: curl_read_callback = { buffer, size, count, context in
    guard let buffer, let context else { return Int(CURL_READFUNC_ABORT) }
    let transfer = Transfer.from(context)
    return transfer.request.body.withUnsafeBytes { body in
        let offset = Int(clamping: transfer.bodySent)
        let length = min(size * count, body.count - offset)
        guard length > 0, let start = body.baseAddress else { return 0 }
        UnsafeMutableRawPointer(buffer).copyMemory(from: start + offset, byteCount: length)
        transfer.bodySent += Int64(length)
        return length
    }
}

// A streamed request body goes to libcurl exactly as long as the exchange said (`bodyLength`, which
// libcurl sends as Content-Length): never a byte more, and a body that ends short stops the
// exchange (libcurl closes the connection of a transfer aborted this way; options may not be set
// from inside a callback). Without a length, libcurl frames the body itself (chunked).
private let readCallback: curl_read_callback = { buffer, size, count, context in
    guard let buffer, let context else { return Int(CURL_READFUNC_ABORT) }
    let transfer = Transfer.from(context)
    guard let exchange = transfer.exchange else { return Int(CURL_READFUNC_ABORT) }
    var room = size * count
    if let declared = exchange.bodyLength {
        let left = Int64(declared) - transfer.bodySent
        guard left > 0 else { return 0 }
        room = Int(min(Int64(room), left))
    }
    switch exchange.delegate.upstreamReadBody(into: UnsafeMutableRawBufferPointer(start: buffer, count: room)) {
    case .bytes(let n):
        transfer.bodySent += Int64(n)
        return n
    case .end where exchange.bodyLength.map({ Int64($0) == transfer.bodySent }) ?? true:
        return 0
    case .end, .abort:
        return Int(CURL_READFUNC_ABORT)
    case .wait:
        transfer.paused = true
        return Int(CURL_READFUNC_PAUSE)
    }
}
