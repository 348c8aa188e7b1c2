import Synchronization

/// A thread's event loop that can run other libraries' event sources besides its own work, so
/// that work begun by a source (a request that starts an upstream exchange) stays on one thread.
///
/// The HTTP client's loops are the hosts; the token listener's daemons are the sources when
/// proxies are configured. Neither module knows the other: they meet through this protocol.
public protocol EventLoopHost: AnyObject, Sendable {
    /// Runs `work` on the loop's thread between two turns and returns once it has run. Called on
    /// the loop's own thread, it runs `work` at once.
    func runOnLoop(_ work: @escaping @Sendable () -> Void)
    /// The loop polls `source` from its next turn on. Call `runOnLoop` with `detach` to stop.
    func attach(_ source: EventLoopSource)
    /// The loop stops polling `source`. On the loop's thread only (inside `runOnLoop`).
    func detach(_ source: EventLoopSource)
    /// Ends the loop's current wait, from any thread.
    func wake()
}

/// One source of events on an `EventLoopHost`: a descriptor the loop polls for reading, and the
/// work it runs on the loop's thread when the descriptor is readable, when the source's own
/// timeout ends, or after another thread called `markPending`.
///
/// - Important: the work must never block: the loop's other work (libcurl's transfers, other
///   sources) waits while it runs. A libmicrohttpd daemon's `MHD_run` in external mode polls
///   with a zero timeout.
// Unchecked: the closures are run on the host's thread alone; `pending` is atomic.
public final class EventLoopSource: @unchecked Sendable {
    public let descriptor: Int32
    /// The host that polls it.
    public let host: any EventLoopHost
    private let work: () -> Void
    private let timeout: () -> Int32
    private let pending = Atomic<Bool>(false)

    /// - Parameters:
    ///   - timeoutMilliseconds: how long the source may wait for its descriptor before it must run
    ///     anyway; asked before each wait, on the host's thread.
    ///   - run: the source's work, on the host's thread.
    public init(
        descriptor: Int32, host: any EventLoopHost, timeoutMilliseconds: @escaping () -> Int32,
        run: @escaping () -> Void
    ) {
        self.descriptor = descriptor
        self.host = host
        self.timeout = timeoutMilliseconds
        self.work = run
    }

    /// From any thread: the source has work that its descriptor will not show (a resumed
    /// connection). The host runs it at its next turn; a burst of calls wakes the host once.
    public func markPending() {
        if !pending.exchange(true, ordering: .acquiringAndReleasing) { host.wake() }
    }

    // For the host, on its thread.

    /// Whether `markPending` was called since the last run.
    public var isPending: Bool { pending.load(ordering: .acquiring) }
    public var timeoutMilliseconds: Int32 { timeout() }
    /// Runs the source's work and clears its pending mark (first, so that a mark made while it
    /// runs is seen at the next turn).
    public func run() {
        pending.store(false, ordering: .releasing)
        work()
    }
}
