internal import CCurl
import Glibc
import Synchronization
import TokenBrokerCore

/// The HTTP client for issuers: libcurl (OpenSSL flavour) driven by one thread of its own.
///
/// Every request of every source goes through one `curl_multi` loop on a dedicated thread, so an
/// upstream fetch never blocks a server thread nor a thread of Swift's cooperative pool; callers
/// simply `await`. TLS verification is always on, redirects are never followed, only http and
/// https are spoken, bodies are capped, and `HTTPS_PROXY` / `NO_PROXY` are honoured as libcurl
/// reads them from the environment. It knows nothing of tokens: a failure is an `UpstreamError`.
///
/// Locks: `queue`, `abandoned` and `commands` are each taken alone, never one inside another.
// Unchecked: `multi` is a libcurl pointer and `startFailure` and `thread` are set only in `init`;
// everything else that changes is behind a lock or touched by the curl thread alone.
public final class UpstreamHTTPClient: @unchecked Sendable {
    public static let shared = UpstreamHTTPClient()

    /// Nil only when the client could not start (then `startFailure` says why).
    private let multi: UnsafeMutableRawPointer!
    /// Why the client could not start (libcurl's set-up, its multi handle, or its thread); nil
    /// when it runs. Written once, in `init`. The broker checks it at start and refuses to run.
    public private(set) var startFailure: String?
    private let queue = Lock<[Transfer]>([])
    /// Work for the curl thread on transfers already running: unpause, or cancel.
    /// Buffered requests whose caller gave up: stopped at the curl thread's next turn.
    private let abandoned = Lock<[Transfer]>([])
    private let commands = Lock<[(UpstreamExchange, Command)]>([])
    private var thread = pthread_t()

    enum Command { case resumeReceiving, resumeSending, cancel }

    /// One request in flight: its easy handle, what came back so far, and who waits.
    ///
    /// - Important: only the curl thread reads or changes it once queued; other threads only
    ///   hand the reference over, through the queue's and the abandoned list's locks.
    final class Transfer: @unchecked Sendable {
        let request: UpstreamRequest
        /// A buffered request's waiter; nil for a streamed exchange.
        let continuation: CheckedContinuation<UpstreamResponse, any Error>?
        /// A streamed exchange; nil for a buffered request.
        let exchange: UpstreamExchange?
        var easy: UnsafeMutableRawPointer?
        var headerList: UnsafeMutablePointer<curl_slist>?
        var body: [UInt8] = []
        var headers: [String: String] = [:]
        /// Every header of the final answer, in order, names as sent (streamed exchanges).
        var headerLines: [(String, String)] = []
        var tooLarge = false
        var bodyCopy: [CChar] = []
        var headDelivered = false
        var cancelled = false
        /// Bytes of a streamed request body handed to libcurl so far.
        var bodySent: Int64 = 0

        init(request: UpstreamRequest, continuation: CheckedContinuation<UpstreamResponse, any Error>) {
            self.request = request
            self.continuation = continuation
            exchange = nil
        }

        init(request: UpstreamRequest, exchange: UpstreamExchange) {
            self.request = request
            continuation = nil
            self.exchange = exchange
        }
    }

    private init() {
        let code = curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        guard code == CURLE_OK else {
            multi = nil
            startFailure = "libcurl could not initialise: \(String(cString: curl_easy_strerror(code)))"
            return
        }
        guard let multi = curl_multi_init() else {
            self.multi = nil
            startFailure = "libcurl could not create its multi handle"
            return
        }
        self.multi = multi
        let context = Unmanaged.passRetained(self).toOpaque()
        let status = pthread_create(
            &thread, nil,
            { context in
                Unmanaged<UpstreamHTTPClient>.fromOpaque(context!).takeRetainedValue().loop()
                return nil
            }, context)
        if status != 0 {
            Unmanaged<UpstreamHTTPClient>.fromOpaque(context).release()
            startFailure = "cannot start the HTTP client's thread: \(String(cString: strerror(status)))"
        }
    }

    /// Sends one request and waits for its answer, without holding any thread while it waits.
    public func send(_ request: UpstreamRequest) async throws(UpstreamError) -> UpstreamResponse {
        if let startFailure { throw .clientFailure(startFailure) }
        // A caller that gives up (a provider past its fetch deadline) stops the transfer too, so
        // that abandoned requests do not pile up on the issuer until libcurl's own timeout.
        let sent = Lock<Transfer?>(nil)
        do {
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation {
                    (continuation: CheckedContinuation<UpstreamResponse, any Error>) in
                    let transfer = Transfer(request: request, continuation: continuation)
                    sent.withLock { $0 = transfer }
                    queue.withLock { $0.append(transfer) }
                    if Task.isCancelled { abandoned.withLock { $0.append(transfer) } }
                    curl_multi_wakeup(multi)
                }
            } onCancel: {
                guard let transfer = sent.withLock({ $0 }) else { return }
                abandoned.withLock { $0.append(transfer) }
                curl_multi_wakeup(multi)
            }
        } catch let error as UpstreamError {
            throw error
        } catch {
            throw .clientFailure("\(error)")
        }
    }

    /// Starts a streamed exchange: the answer's head, then its body, go to `exchange`'s delegate
    /// as they arrive, and a streamed request body is read from it as the upstream takes it.
    public func start(_ exchange: UpstreamExchange) {
        if let startFailure {
            exchange.delegate.upstreamFinished(.clientFailure(startFailure))
            return
        }
        queue.withLock { $0.append(Transfer(request: exchange.request, exchange: exchange)) }
        curl_multi_wakeup(multi)
    }

    func post(_ command: Command, for exchange: UpstreamExchange) {
        guard startFailure == nil else { return }
        commands.withLock { $0.append((exchange, command)) }
        curl_multi_wakeup(multi)
    }

    // MARK: - The curl thread

    private func loop() {
        var active: [UnsafeMutableRawPointer: Transfer] = [:]
        var streamed: [ObjectIdentifier: Transfer] = [:]
        while true {
            for transfer in queue.withLock({ queued in
                defer { queued = [] }
                return queued
            }) {
                if let problem = prepare(transfer) {
                    notStarted(transfer, problem)
                    continue
                }
                let added = curl_multi_add_handle(multi, transfer.easy)
                guard added == CURLM_OK else {
                    release(transfer)
                    notStarted(
                        transfer,
                        .clientFailure(
                            "libcurl could not start the request: \(String(cString: curl_multi_strerror(added)))"))
                    continue
                }
                active[transfer.easy!] = transfer
                if let exchange = transfer.exchange { streamed[ObjectIdentifier(exchange)] = transfer }
            }
            for (exchange, command) in commands.withLock({ queued in
                defer { queued = [] }
                return queued
            }) {
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
            for transfer in abandoned.withLock({ queued in
                defer { queued = [] }
                return queued
            }) {
                guard let easy = transfer.easy, active[easy] === transfer else { continue }  // finished already
                active.removeValue(forKey: easy)
                stop(transfer, easy)
            }
            var running: Int32 = 0
            curl_multi_perform(multi, &running)
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
            curl_multi_poll(multi, nil, 0, 1000, nil)
        }
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

    /// Builds the easy handle; returns an error instead when the request cannot be sent.
    private func prepare(_ transfer: Transfer) -> UpstreamError? {
        guard let easy = curl_easy_init() else { return .clientFailure("curl_easy_init failed") }
        transfer.easy = easy
        let request = transfer.request
        let settings = request.settings
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        var ok = true
        func set(_ code: CURLcode) { ok = ok && code == CURLE_OK }
        set(CCurl_setopt_string(easy, CURLOPT_URL, request.url))
        set(CCurl_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "http,https"))
        set(CCurl_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        set(CCurl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0))
        set(CCurl_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1))
        set(CCurl_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2))
        set(CCurl_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, settings.connectTimeoutMsec))
        set(CCurl_setopt_long(easy, CURLOPT_TIMEOUT_MS, settings.timeoutMsec))
        if let socket = request.unixSocketPath { set(CCurl_setopt_string(easy, CURLOPT_UNIX_SOCKET_PATH, socket)) }
        if let caFile = settings.caFile { set(CCurl_setopt_string(easy, CURLOPT_CAINFO, caFile)) }
        if let certificate = settings.clientCertFile { set(CCurl_setopt_string(easy, CURLOPT_SSLCERT, certificate)) }
        if let key = settings.clientKeyFile { set(CCurl_setopt_string(easy, CURLOPT_SSLKEY, key)) }
        set(CCurl_setopt_string(easy, CURLOPT_CUSTOMREQUEST, request.method))
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
        } else if request.body.isEmpty && transfer.exchange != nil {
            // DELETE, OPTIONS and the like without a body: the method alone.
        } else {
            transfer.bodyCopy = request.body.map { CChar(bitPattern: $0) }
            set(CCurl_setopt_long(easy, CURLOPT_POSTFIELDSIZE, request.body.count))
            set(
                transfer.bodyCopy.withUnsafeMutableBufferPointer {
                    CCurl_setopt_pointer(easy, CURLOPT_POSTFIELDS, $0.baseAddress)
                })
        }
        for (name, value) in request.headers where !(name + value).contains(where: { $0 == "\r" || $0 == "\n" }) {
            transfer.headerList = curl_slist_append(transfer.headerList, "\(name): \(value)")
        }
        // libcurl would add "Expect: 100-continue" to larger POSTs; issuers gain nothing from it.
        transfer.headerList = curl_slist_append(transfer.headerList, "Expect:")
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

    private func finish(_ transfer: Transfer, _ result: CURLcode) {
        defer { release(transfer) }
        if let exchange = transfer.exchange {
            finishStreamed(transfer, exchange, result)
            return
        }
        guard let continuation = transfer.continuation else { return }
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
                continuation.resume(throwing: UpstreamError.unreachable(reason))
            }
            return
        }
        var status = 0
        _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
        continuation.resume(returning: UpstreamResponse(status: status, headers: transfer.headers, body: transfer.body))
    }

    private func finishStreamed(_ transfer: Transfer, _ exchange: UpstreamExchange, _ result: CURLcode) {
        switch result {
        case CURLE_OK:
            if !transfer.headDelivered { deliverHead(transfer, exchange) }
            exchange.delegate.upstreamFinished(nil)
        case CURLE_OPERATION_TIMEDOUT:
            exchange.delegate.upstreamFinished(.timeout(String(cString: curl_easy_strerror(result))))
        case _ where transfer.cancelled || exchange.stoppedOnPurpose:
            exchange.delegate.upstreamFinished(.stopped)
        default:
            exchange.delegate.upstreamFinished(.unreachable(String(cString: curl_easy_strerror(result))))
        }
    }

    /// The final answer's head is complete: hand it over once.
    fileprivate func deliverHead(_ transfer: Transfer, _ exchange: UpstreamExchange) {
        transfer.headDelivered = true
        var status = 0
        _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
        var length: curl_off_t = -1
        _ = CCurl_getinfo_offset(transfer.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length)
        if !exchange.delegate.upstreamHead(
            status: status, headers: transfer.headerLines, length: length >= 0 ? Int64(length) : nil)
        {
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

    private func release(_ transfer: Transfer) {
        curl_easy_cleanup(transfer.easy)
        curl_slist_free_all(transfer.headerList)
        transfer.easy = nil
        transfer.headerList = nil
    }

    static func transfer(_ context: UnsafeMutableRawPointer) -> Transfer {
        Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
    }

    fileprivate static func appendBody(
        _ context: UnsafeMutableRawPointer, _ data: UnsafeMutablePointer<CChar>, _ length: Int
    ) -> Int {
        let transfer = transfer(context)
        if let exchange = transfer.exchange {
            if !transfer.headDelivered { shared.deliverHead(transfer, exchange) }
            if exchange.stoppedOnPurpose { return 0 }
            return exchange.delegate.upstreamBody(UnsafeRawBufferPointer(start: data, count: length))
                ? length : Int(CURL_WRITEFUNC_PAUSE)
        }
        guard transfer.body.count + length <= transfer.request.settings.maxResponseBytes else {
            transfer.tooLarge = true
            return 0
        }
        data.withMemoryRebound(to: UInt8.self, capacity: length) {
            transfer.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: length))
        }
        return length
    }

    fileprivate static func appendHeader(
        _ context: UnsafeMutableRawPointer, _ data: UnsafeMutablePointer<CChar>, _ length: Int
    ) -> Int {
        let transfer = transfer(context)
        let line = data.withMemoryRebound(to: UInt8.self, capacity: length) {
            String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
        }
        if line.hasPrefix("HTTP/") {
            transfer.headers = [:]  // a new response (after 100 Continue): forget the interim one's headers
            transfer.headerLines = []
        } else if let exchange = transfer.exchange, line == "\r\n" || line == "\n" {
            var status = 0
            _ = CCurl_getinfo_long(transfer.easy, CURLINFO_RESPONSE_CODE, &status)
            if status >= 200, !transfer.headDelivered {
                shared.deliverHead(transfer, exchange)
                if exchange.stoppedOnPurpose { return 0 }
            }
        } else if let colon = line.firstIndex(of: ":") {
            let name = line[..<colon]
            let value = line[line.index(after: colon)...].trimmingCharacters(in: " \t\r\n")
            if transfer.exchange != nil {
                // Streamed exchanges pass every header on, in order, names as sent.
                if transfer.headerLines.count < 200 { transfer.headerLines.append((String(name), value)) }
            } else if transfer.headers.count < 100 {
                transfer.headers[name.lowercased()] = value
            }
        }
        return length
    }
}

// Top-level C callbacks: they capture nothing and find the transfer through their context pointer.

private let bodyCallback: curl_write_callback = { data, size, count, context in
    guard let data, let context else { return 0 }
    return UpstreamHTTPClient.appendBody(context, data, size * count)
}

// A streamed request body goes to libcurl exactly as long as the exchange said (`bodyLength`, which
// libcurl sends as Content-Length): never a byte more, and a body that ends short stops the
// exchange (libcurl closes the connection of a transfer aborted this way; options may not be set
// from inside a callback). Without a length, libcurl frames the body itself (chunked).
private let readCallback: curl_read_callback = { buffer, size, count, context in
    guard let buffer, let context else { return Int(CURL_READFUNC_ABORT) }
    let transfer = UpstreamHTTPClient.transfer(context)
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
        return Int(CURL_READFUNC_PAUSE)
    }
}

private let headerCallback: curl_write_callback = { data, size, count, context in
    guard let data, let context else { return 0 }
    return UpstreamHTTPClient.appendHeader(context, data, size * count)
}
