internal import CCurl
import Glibc
import Synchronization
import TokenBrokerCore

/// The HTTP client for issuers and proxy targets: libcurl (OpenSSL flavour) driven by threads of
/// its own.
///
/// Every request runs on a `curl_multi` loop (`CurlLoop`) on a dedicated thread, so an upstream
/// exchange never blocks a server thread nor a thread of Swift's cooperative pool; callers
/// simply `await`. Issuers' requests share the first loop. Proxy exchanges are spread over one
/// loop per processor (at most eight) once `startProxyLoops` has run, so that proxied traffic is
/// not held to one thread; the token listener then runs on those loops too, so that a proxied
/// request and its exchange share a thread. TLS verification is always on, redirects are never
/// followed, only http and https are spoken, bodies are capped, and `HTTPS_PROXY` / `NO_PROXY`
/// are honoured as libcurl reads them from the environment. It knows nothing of tokens: a failure is an
/// `UpstreamError`.
public final class UpstreamHTTPClient: Sendable {
    public static let shared = UpstreamHTTPClient()

    /// Why the client could not start (libcurl's set-up, its multi handle, or its thread); nil
    /// when it runs. The broker checks it at start and refuses to run.
    public let startFailure: String?
    /// Every loop there may be; the first `running` of them have their thread.
    private let loops: [CurlLoop]
    private let running = Atomic<Int>(0)
    private let turn = Atomic<Int>(0)
    /// Serialises `startProxyLoops`.
    private let starting = Lock(())

    private init() {
        let code = curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        guard code == CURLE_OK else {
            loops = []
            startFailure = "libcurl could not initialise: \(String(cString: curl_easy_strerror(code)))"
            return
        }
        let count = Self.loopCount
        var loops: [CurlLoop] = []
        var problem = ""
        for _ in 0..<count {
            guard let loop = CurlLoop(problem: &problem) else { break }
            loops.append(loop)
        }
        self.loops = loops
        guard let first = loops.first else {
            startFailure = problem
            return
        }
        startFailure = first.start()
        if startFailure == nil { running.store(1, ordering: .releasing) }
    }

    /// How many loops there are: one per processor, at most eight. Reading it starts nothing.
    public static let loopCount = min(max(Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))), 1), 8)

    /// Starts the loops beyond the first, for proxied traffic; returns why one could not start
    /// (the ones started keep running), or nil. Safe to call more than once.
    public func startProxyLoops() -> String? {
        if let startFailure { return startFailure }
        return starting.withLock { _ -> String? in
            while running.load(ordering: .acquiring) < loops.count {
                if let failure = loops[running.load(ordering: .acquiring)].start() { return failure }
                running.add(1, ordering: .releasing)
            }
            return nil
        }
    }

    /// The loops started so far, as hosts for other event sources (the token listener's daemons
    /// when proxies are configured; see `CurlLoop`). Call `startProxyLoops` first.
    public var eventLoops: [any EventLoopHost] {
        Array(loops[..<running.load(ordering: .acquiring)])
    }

    /// The loop for the next proxy exchange: the calling thread's own when it is one (a request
    /// read by a daemon that loop runs), else the running loops in turn.
    func nextLoop() -> CurlLoop? {
        let count = running.load(ordering: .acquiring)
        guard count > 0 else { return nil }
        for loop in loops[..<count] where loop.isCurrent { return loop }
        return loops[turn.add(1, ordering: .relaxed).newValue % count]
    }

    /// Sends one request and waits for its answer, without holding any thread while it waits.
    public func send(_ request: UpstreamRequest) async throws(UpstreamError) -> UpstreamResponse {
        if let startFailure { throw .clientFailure(startFailure) }
        let loop = loops[0]
        // A caller that gives up (a provider past its fetch deadline) stops the transfer too, so
        // that abandoned requests do not pile up on the issuer until libcurl's own timeout.
        let sent = Lock<Transfer?>(nil)
        do {
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation {
                    (continuation: CheckedContinuation<UpstreamResponse, any Error>) in
                    let transfer = Transfer(request: request, continuation: continuation)
                    sent.withLock { $0 = transfer }
                    loop.enqueue(transfer)
                    if Task.isCancelled { loop.abandon(transfer) }
                }
            } onCancel: {
                guard let transfer = sent.withLock({ $0 }) else { return }
                loop.abandon(transfer)
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
        guard let loop = exchange.loop else {
            exchange.delegate.upstreamFinished(.clientFailure(startFailure ?? "the HTTP client is not running"))
            return
        }
        loop.enqueue(Transfer(exchange: exchange))
    }
}
