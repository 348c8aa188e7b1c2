import Synchronization
import TokenBrokerCore

/// One streamed exchange with an upstream server, for the proxy: the request's body may flow in
/// as the client sends it, and the answer flows out as the upstream sends it.
///
/// The delegate's methods run on the upstream client's thread; none may block.
// Unchecked: `stoppedOnPurpose`, its one plain variable, is read and written on the curl thread alone.
public final class UpstreamExchange: @unchecked Sendable {
    public let request: UpstreamRequest
    /// Whether the body is read from the delegate as it arrives, rather than taken from `request.body`.
    public let streamsBody: Bool
    /// The streamed body's length, when the client said (`Content-Length`).
    public let bodyLength: Int?
    let delegate: any UpstreamExchangeDelegate
    /// Set on the curl thread when the delegate refused the head.
    var stoppedOnPurpose = false
    /// Set by `cancel`, from any thread: an exchange cancelled before its loop started it never starts.
    let cancelRequested = Atomic<Bool>(false)
    /// The loop it runs on, chosen when it is made so that every command finds it; nil when the
    /// client is not running (then `start` fails it at once).
    let loop: CurlLoop?

    public init(request: UpstreamRequest, streamsBody: Bool, bodyLength: Int?, delegate: any UpstreamExchangeDelegate) {
        self.request = request
        self.streamsBody = streamsBody
        self.bodyLength = bodyLength
        self.delegate = delegate
        loop = UpstreamHTTPClient.shared.nextLoop()
    }

    /// Call after `upstreamBody` returned false, once there is room again.
    public func resumeReceiving() { loop?.post(.resumeReceiving, for: self) }
    /// Call after `upstreamReadBody` said `.wait`, once there are bytes.
    public func resumeSending() { loop?.post(.resumeSending, for: self) }
    /// Stops the exchange; `upstreamFinished` follows (with `.stopped` when it had not started).
    public func cancel() {
        cancelRequested.store(true, ordering: .relaxed)
        loop?.post(.cancel, for: self)
    }
}

/// Receives a streamed exchange's answer and supplies its streamed body.
public protocol UpstreamExchangeDelegate: AnyObject, Sendable {
    /// The final answer's status and headers (in order, names as sent, values as the bytes sent),
    /// with the part of its body that came with them (at most `CurlLoop.heldBodyLimit` bytes).
    /// When `complete`, that is the whole answer, and `upstreamFinished(nil)` is all that
    /// follows. Return false to stop the exchange without reading the rest of the body.
    func upstreamHead(
        status: Int, headers: [(String, [UInt8])], length: Int64?, body: UnsafeRawBufferPointer, complete: Bool
    ) -> Bool
    /// A piece of the body. Return false, taking nothing, to pause until `resumeReceiving`.
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool
    /// The exchange ended: nil when the whole answer came, else why not.
    func upstreamFinished(_ error: UpstreamError?)
    /// Bytes of a streamed request body.
    func upstreamReadBody(into buffer: UnsafeMutableRawBufferPointer) -> UpstreamBodyRead
}

/// What a streamed request body had to give.
public enum UpstreamBodyRead {
    case bytes(Int)
    /// None yet: pause until `resumeSending`.
    case wait
    case end
    /// Stop the exchange.
    case abort
}
