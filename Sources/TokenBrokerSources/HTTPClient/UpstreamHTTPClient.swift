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
/// reads them from the environment.
public final class UpstreamHTTPClient: @unchecked Sendable {
    public static let shared = UpstreamHTTPClient()

    private let multi: UnsafeMutableRawPointer
    private let queue = Lock<[Transfer]>([])
    /// Work for the curl thread on transfers already running: unpause, or cancel.
    private let commands = Lock<[(UpstreamExchange, Command)]>([])
    private var thread = pthread_t()

    enum Command { case resumeReceiving, resumeSending, cancel }

    /// One request in flight: its easy handle, what came back so far, and who waits.
    final class Transfer {
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
        curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        multi = curl_multi_init()!
        let context = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&thread, nil, { context in
            Unmanaged<UpstreamHTTPClient>.fromOpaque(context!).takeRetainedValue().loop()
            return nil
        }, context)
    }

    /// Sends one request and waits for its answer, without holding any thread while it waits.
    public func send(_ request: UpstreamRequest) async throws(TokenFetchError) -> UpstreamResponse {
        do {
            return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<UpstreamResponse, any Error>) in
                queue.withLock { $0.append(Transfer(request: request, continuation: continuation)) }
                curl_multi_wakeup(multi)
            }
        } catch let error as TokenFetchError {
            throw error
        } catch {
            throw .internalError("\(error)")
        }
    }

    /// Starts a streamed exchange: the answer's head, then its body, go to `exchange`'s delegate
    /// as they arrive, and a streamed request body is read from it as the upstream takes it.
    public func start(_ exchange: UpstreamExchange) {
        queue.withLock { $0.append(Transfer(request: exchange.request, exchange: exchange)) }
        curl_multi_wakeup(multi)
    }

    func post(_ command: Command, for exchange: UpstreamExchange) {
        commands.withLock { $0.append((exchange, command)) }
        curl_multi_wakeup(multi)
    }

    // MARK: - The curl thread

    private func loop() {
        var active: [UnsafeMutableRawPointer: Transfer] = [:]
        var streamed: [ObjectIdentifier: Transfer] = [:]
        while true {
            for transfer in queue.withLock({ queued in defer { queued = [] }; return queued }) {
                if let problem = prepare(transfer) {
                    if let exchange = transfer.exchange {
                        exchange.delegate.upstreamFinished(problem)
                    } else {
                        transfer.continuation?.resume(throwing: problem)
                    }
                    continue
                }
                active[transfer.easy!] = transfer
                if let exchange = transfer.exchange { streamed[ObjectIdentifier(exchange)] = transfer }
                curl_multi_add_handle(multi, transfer.easy)
            }
            for (exchange, command) in commands.withLock({ queued in defer { queued = [] }; return queued }) {
                guard let transfer = streamed[ObjectIdentifier(exchange)], let easy = transfer.easy else { continue }
                switch command {
                case .resumeReceiving, .resumeSending:
                    curl_easy_pause(easy, CURLPAUSE_CONT)
                case .cancel:
                    active.removeValue(forKey: easy)
                    streamed.removeValue(forKey: ObjectIdentifier(exchange))
                    curl_multi_remove_handle(multi, easy)
                    transfer.cancelled = true
                    finish(transfer, CURLE_ABORTED_BY_CALLBACK)
                }
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

    /// Builds the easy handle; returns an error instead when the request cannot be sent.
    private func prepare(_ transfer: Transfer) -> TokenFetchError? {
        guard let easy = curl_easy_init() else { return .internalError("curl_easy_init failed") }
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
            set(transfer.bodyCopy.withUnsafeMutableBufferPointer { CCurl_setopt_pointer(easy, CURLOPT_POSTFIELDS, $0.baseAddress) })
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
            return .configuration("libcurl refused the request's settings (check caFile and the client certificate)")
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
                continuation.resume(throwing: TokenFetchError.badResponse("the answer is larger than \(transfer.request.settings.maxResponseBytes) bytes"))
            case CURLE_OPERATION_TIMEDOUT:
                continuation.resume(throwing: TokenFetchError.timeout(reason))
            default:
                continuation.resume(throwing: TokenFetchError.unreachable(reason))
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
            exchange.delegate.upstreamFinished(.internalError("stopped"))
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
        if !exchange.delegate.upstreamHead(status: status, headers: transfer.headerLines, length: length >= 0 ? Int64(length) : nil) {
            exchange.stoppedOnPurpose = true
        }
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

    fileprivate static func appendBody(_ context: UnsafeMutableRawPointer, _ data: UnsafeMutablePointer<CChar>, _ length: Int) -> Int {
        let transfer = transfer(context)
        if let exchange = transfer.exchange {
            if !transfer.headDelivered { shared.deliverHead(transfer, exchange) }
            if exchange.stoppedOnPurpose { return 0 }
            return exchange.delegate.upstreamBody(UnsafeRawBufferPointer(start: data, count: length)) ? length : Int(CURL_WRITEFUNC_PAUSE)
        }
        guard transfer.body.count + length <= transfer.request.settings.maxResponseBytes else {
            transfer.tooLarge = true
            return 0
        }
        data.withMemoryRebound(to: UInt8.self, capacity: length) { transfer.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: length)) }
        return length
    }

    fileprivate static func appendHeader(_ context: UnsafeMutableRawPointer, _ data: UnsafeMutablePointer<CChar>, _ length: Int) -> Int {
        let transfer = transfer(context)
        let line = data.withMemoryRebound(to: UInt8.self, capacity: length) { String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self) }
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

private let readCallback: curl_read_callback = { buffer, size, count, context in
    guard let buffer, let context else { return Int(CURL_READFUNC_ABORT) }
    let transfer = UpstreamHTTPClient.transfer(context)
    guard let exchange = transfer.exchange else { return Int(CURL_READFUNC_ABORT) }
    switch exchange.delegate.upstreamReadBody(into: UnsafeMutableRawBufferPointer(start: buffer, count: size * count)) {
    case .bytes(let n): return n
    case .end: return 0
    case .wait: return Int(CURL_READFUNC_PAUSE)
    case .abort: return Int(CURL_READFUNC_ABORT)
    }
}

private let headerCallback: curl_write_callback = { data, size, count, context in
    guard let data, let context else { return 0 }
    return UpstreamHTTPClient.appendHeader(context, data, size * count)
}
