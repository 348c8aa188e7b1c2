import TokenBrokerCore

extension HTTPServer {
    /// How the listener's daemons are set up. Every limit is explicit.
    public struct Configuration: Sendable {
        public var address: ListenAddress
        /// `MHD_OPTION_CONNECTION_LIMIT`: open connections at most. Past fifteen sixteenths of it,
        /// each new connection closes the one that has waited longest for its next request.
        public var connectionLimit: Int = 10_000
        /// The most requests that may wait at once (deferred answers, `WaitingPlaces`): seven
        /// eighths of `connectionLimit`, so that an eighth is always left to requests answered at once.
        public var waitingLimit: Int { HTTPServer.waitingLimit(connectionLimit: connectionLimit) }
        /// `MHD_OPTION_CONNECTION_MEMORY_LIMIT`: each connection's buffer for the request line,
        /// headers and the answer's headers; request heads that leave too little of it for the
        /// answer's head get 431 (`AnswerRoom`). It is also most of what a waiting long-poll
        /// costs, so it is small: 4 KiB holds about 3.3 KiB of headers.
        public var connectionMemoryLimit: Int = 4 * 1024
        /// `MHD_OPTION_CONNECTION_TIMEOUT`: seconds an idle connection is kept; also the longest
        /// a request may take to arrive whole (`ConnectionWatcher`). Suspended connections do
        /// not time out by themselves.
        public var connectionTimeoutSec: Int = 30
        /// Threads polling connections: one daemon on each (`DaemonThread`), with its share of
        /// `connectionLimit`.
        public var threads: Int = 2
        /// When not empty, the listener has no threads of its own (`threads` is ignored): one
        /// daemon per loop runs on the loop's thread, with its share of `connectionLimit`. The
        /// broker's token listener runs on the HTTP client's loops when proxies are configured,
        /// so that a proxied request and its upstream exchange never change threads.
        public var eventLoops: [any EventLoopHost] = []
        /// Request bodies longer than this are answered with 413, on every route (those under
        /// `streamingPrefix` set their own limit in `HTTPHandler.begin`).
        public var maximumBodyBytes: Int = 64 * 1024
        /// The file mode of a Unix socket listener.
        public var unixSocketMode: UInt32 = 0o660
        /// Where libmicrohttpd's own messages go (a failed send, a malformed request), one line
        /// each; they may quote a client's path, so the sink must escape them. Nil: dropped.
        public var libraryLog: (@Sendable (String) -> Void)?
        /// Requests whose target starts with this are shown to `HTTPHandler.begin` when their
        /// headers arrive, and carry their target as sent (`HTTPRequest.rawTarget`).
        public var streamingPrefix: String?

        public init(address: ListenAddress) { self.address = address }
    }

    /// The most requests that may wait at once on a listener of `connectionLimit` connections:
    /// seven eighths of it (`WaitingPlaces`).
    public static func waitingLimit(connectionLimit: Int) -> Int {
        WaitingPlaces.limit(connectionLimit: connectionLimit)
    }
}
