import Synchronization
import TokenBrokerCore

/// Bodies that flow through the server instead of sitting in memory whole: a request body handed
/// to a consumer as it arrives, and a response body sent to the client as a producer makes it.
///
/// Each is a bounded queue of bytes between a libmicrohttpd thread and another thread (such as
/// the upstream client's). When the queue is full the producer pauses; when it is empty the
/// consumer waits; either side wakes the other. A waiting libmicrohttpd connection is suspended,
/// never a thread blocked.

/// The bytes in flight, with the two sides' waiting flags; guarded by its owner's mutex.
struct ByteQueue {
    private var chunks: [[UInt8]] = []
    private var head = 0  // bytes of chunks[0] already taken
    private(set) var count = 0

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        chunks.append(Array(bytes))
        count += bytes.count
    }

    /// Moves up to `max` bytes into `destination`; returns how many.
    mutating func take(into destination: UnsafeMutableRawBufferPointer) -> Int {
        var written = 0
        while written < destination.count, !chunks.isEmpty {
            let chunk = chunks[0]
            let n = min(chunk.count - head, destination.count - written)
            chunk.withUnsafeBytes { source in
                destination.baseAddress!.advanced(by: written).copyMemory(
                    from: source.baseAddress!.advanced(by: head), byteCount: n)
            }
            written += n
            head += n
            if head == chunk.count {
                chunks.removeFirst()
                head = 0
            }
        }
        count -= written
        return written
    }

    mutating func removeAll() {
        chunks = []
        head = 0
        count = 0
    }
}

/// How much a stream holds before its producer must pause, and how far it drains before the
/// producer may go on.
enum StreamLimits {
    static let highWater = 256 * 1024
    static let lowWater = 64 * 1024
}

/// A response body written by a producer on any thread and sent by libmicrohttpd as it comes.
///
/// The producer calls `write` (false: full, pause and wait for `onDrained`), then `finish`. If the
/// client goes away first, `onClientGone` runs once so the producer can stop.
public final class HTTPResponseStream: Sendable {
    private struct State {
        var queue = ByteQueue()
        var finished = false
        var failed = false
        var consumerWaiting = false
        var producerPaused = false
        var responder: HTTPResponder?
    }

    /// Lock order: this lock, then the server's lock of suspended connections (`read` suspends
    /// the connection through `suspendForStream` while holding it); nothing else is taken under
    /// it, and `onDrained` and resuming run after it is released.
    private let state = Lock(State())
    private let onDrained: @Sendable () -> Void

    /// - Parameter onDrained: called (on a server thread) when a paused producer may write again.
    public init(onDrained: @escaping @Sendable () -> Void) {
        self.onDrained = onDrained
    }

    /// Hands bytes to the client. Returns false, taking nothing, when the stream is full; the
    /// producer pauses until `onDrained`.
    public func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        let (accepted, wake) = state.withLock { state -> (Bool, HTTPResponder?) in
            if state.finished { return (true, nil) }  // the client is gone: drop it
            guard state.queue.count < StreamLimits.highWater else {
                state.producerPaused = true
                return (false, nil)
            }
            state.queue.append(bytes)
            return (true, Self.wakeConsumer(&state))
        }
        if let wake { wake.resumeStream() }
        return accepted
    }

    /// Ends the body: normally, or with an error (the client sees the connection cut).
    public func finish(failed: Bool = false) {
        let wake = state.withLock { state -> HTTPResponder? in
            guard !state.finished else { return nil }
            state.finished = true
            state.failed = failed
            return Self.wakeConsumer(&state)
        }
        wake?.resumeStream()
    }

    private static func wakeConsumer(_ state: inout State) -> HTTPResponder? {
        guard state.consumerWaiting else { return nil }
        state.consumerWaiting = false
        return state.responder
    }

    // MARK: - The server's side

    /// Binds the stream to the connection it is sent on.
    func attach(_ responder: HTTPResponder) { state.withLock { $0.responder = responder } }

    /// libmicrohttpd's content reader: bytes, or 0 after suspending the connection until more
    /// come, or -1 at the end, or -2 to cut the connection.
    ///
    /// A cut also shuts the socket down here. libmicrohttpd 0.9.75 (epoll) marks the connection
    /// closed when the reader says -2, but when that comes on the reader's first call, right
    /// after the head was written (the producer failed before the answer was queued, as when
    /// a proxied upstream sends its head and then breaks off while the request body is still
    /// coming in), it does not get back to the connection to close its socket until something
    /// else happens on it: the client, holding the head, waits for a body until its own
    /// timeout or the connection timeout.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        var drained = false
        var cut: HTTPResponder?
        let result = state.withLock { state -> Int in
            if state.queue.count > 0 {
                let n = state.queue.take(into: buffer)
                if state.producerPaused, state.queue.count < StreamLimits.lowWater {
                    state.producerPaused = false
                    drained = true
                }
                return n
            }
            if state.finished, !state.failed { return -1 }
            if !state.finished, let responder = state.responder, responder.suspendForStream() {
                state.consumerWaiting = true
                return 0
            }
            cut = state.responder
            return -2
        }
        if drained { onDrained() }
        // Still libmicrohttpd's socket: it is closed only after this call returns.
        cut?.shutDownSocket()
        return result
    }
}

/// A request body that a consumer on another thread reads as it arrives.
public final class HTTPRequestBodyStream: Sendable {
    private struct State {
        var queue = ByteQueue()
        var received = 0
        var ended = false
        var closed = false
        var tooLarge = false
        var producerSuspended = false
        var consumerWaiting = false
        var responder: HTTPResponder?
        /// The connection's request deadline, and how long the rest of a body that nobody reads
        /// any more may take to arrive (`close`).
        var clock: ConnectionClock?
        var drainMsec: Int64 = 0
    }

    /// What `read` found.
    public enum ReadResult {
        case bytes(Int)
        /// Nothing yet: `onAvailable` runs when there is.
        case wait
        case end
        /// The body grew past its limit; the exchange should stop.
        case tooLarge
    }

    /// Lock order: this lock, then the server's lock of suspended connections (`append`
    /// suspends the connection through `suspendForStream` while holding it). `onAvailable` is
    /// never taken under it, and resuming runs after it is released.
    private let state = Lock(State())
    private let limit: Int
    private let onAvailable = Lock<(@Sendable () -> Void)?>(nil)

    /// - Parameter limit: the most bytes accepted; beyond it the body is cut and reads say `tooLarge`.
    public init(limit: Int) { self.limit = limit }

    /// Registers what wakes a waiting consumer.
    public func whenAvailable(_ wake: @escaping @Sendable () -> Void) { onAvailable.withLock { $0 = wake } }

    /// Takes up to `buffer.count` bytes.
    public func read(into buffer: UnsafeMutableRawBufferPointer) -> ReadResult {
        let (result, resume) = state.withLock { state -> (ReadResult, HTTPResponder?) in
            if state.tooLarge { return (.tooLarge, nil) }
            if state.queue.count > 0 {
                let n = state.queue.take(into: buffer)
                var resume: HTTPResponder?
                if state.producerSuspended, state.queue.count < StreamLimits.lowWater {
                    state.producerSuspended = false
                    resume = state.responder
                }
                return (.bytes(n), resume)
            }
            if state.ended { return (.end, nil) }
            state.consumerWaiting = true
            return (.wait, nil)
        }
        resume?.resumeStream()
        return result
    }

    /// The consumer will read no more (the exchange ended): later bytes are dropped, and a
    /// suspended upload goes on so that the request can be answered. The answer is sent only
    /// once the whole body has arrived (libmicrohttpd answers no request mid-body), and the rest
    /// must arrive within the connection's timeout, as a request must: a client that sends a
    /// byte now and then no longer holds the connection for good.
    public func close() {
        let (resume, clock, drainMsec) = state.withLock { state -> (HTTPResponder?, ConnectionClock?, Int64) in
            state.closed = true
            state.queue.removeAll()
            let due = state.ended ? nil : state.clock
            guard state.producerSuspended else { return (nil, due, state.drainMsec) }
            state.producerSuspended = false
            return (state.responder, due, state.drainMsec)
        }
        clock?.armBodyDeadline(after: drainMsec)
        resume?.resumeStream()
    }

    // MARK: - The server's side

    /// - Parameters:
    ///   - clock: the connection's deadline, armed when the consumer stops reading before the end.
    ///   - drainMsec: how long the rest of the body may then take.
    func attach(_ responder: HTTPResponder, clock: ConnectionClock?, drainMsec: Int64) {
        state.withLock {
            $0.responder = responder
            $0.clock = clock
            $0.drainMsec = drainMsec
        }
    }

    /// Bytes from the client. Suspends the connection while the consumer is behind.
    func append(_ bytes: UnsafeRawBufferPointer) {
        let wake = state.withLock { state -> Bool in
            state.received += bytes.count
            if state.received > limit { state.tooLarge = true }
            guard !state.closed, !state.tooLarge else { return Self.takeWaiting(&state) }
            state.queue.append(bytes)
            if state.queue.count >= StreamLimits.highWater, let responder = state.responder,
                responder.suspendForStream()
            {
                state.producerSuspended = true
            }
            return Self.takeWaiting(&state)
        }
        if wake { onAvailable.withLock { $0 }?() }
    }

    /// The client sent the whole body.
    func end() {
        let (wake, drained) = state.withLock { state -> (Bool, ConnectionClock?) in
            state.ended = true
            return (Self.takeWaiting(&state), state.closed ? state.clock : nil)
        }
        // The body is in: the deadline `close` armed for it no longer applies to the answer.
        drained?.requestArrived()
        if wake { onAvailable.withLock { $0 }?() }
    }

    public var isTooLarge: Bool { state.withLock { $0.tooLarge } }

    private static func takeWaiting(_ state: inout State) -> Bool {
        guard state.consumerWaiting else { return false }
        state.consumerWaiting = false
        return true
    }
}
