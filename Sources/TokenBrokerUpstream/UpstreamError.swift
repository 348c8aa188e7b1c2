internal import CCurl

/// Why an exchange with an upstream server gave no answer, as the client saw it.
///
/// The client knows nothing of tokens or proxies: sources turn this into a `TokenFetchError`,
/// the proxy into its own answer. Every text here is libcurl's or the client's own, never a
/// request's header or body, so it is safe to log.
public enum UpstreamError: Error, Sendable, Equatable {
    /// The client itself failed: it could not start, or could not set up or start this request.
    case clientFailure(String)
    /// libcurl refused the request's settings (a CA file or client certificate it cannot use).
    case settingsRefused
    /// A TLS file (`caFile`, `clientCertFile`, `clientKeyFile`) could not be read for the
    /// request: gone, no regular file any more (a FIFO is never waited on), or too large. The
    /// text names the setting, the path and why, never the file's contents.
    case unreadableFile(String)
    /// The server could not be reached, or the exchange broke off: refused, reset, no route,
    /// name not resolved, TLS failed. The text is libcurl's.
    case unreachable(String)
    /// No complete answer within the request's timeouts. The text is libcurl's.
    case timeout(String)
    /// The answer's body was longer than `maxResponseBytes` (buffered requests only).
    case tooLarge(limit: Int)
    /// The answer cannot be passed on, or read, as it came: not HTTP as a server speaks it (a
    /// garbage status line, HTTP/0.9, a header line without a colon or over libcurl's 100 KiB),
    /// two different `Content-Length`s; of a streamed exchange, more header lines than are passed
    /// on, a 101. The exchange stopped and its connection was closed. The text is the client's
    /// own, naming no value.
    case badResponse(String)
    /// Stopped on purpose: cancelled, given up by its caller, or its head refused by the delegate.
    case stopped

    /// What libcurl is told when it refuses the settings, for the callers' messages.
    public static let settingsRefusedDetail =
        "libcurl refused the request's settings (check caFile and the client certificate)"
}

extension UpstreamError {
    /// Whether no answer came at all: nothing listens (refused, no socket, name not resolved),
    /// the request could not be sent, the connection closed or broke before anything was heard,
    /// or nothing came in time. False for an answer that came but is not HTTP as a server speaks
    /// it (a `badResponse`, or an `unreachable` one in libcurl's words for a body cut short):
    /// something answered there. The command line client tells the two apart in its exit status.
    public var isNoAnswer: Bool {
        switch self {
        case .timeout: true
        case .unreachable(let detail): Self.noAnswerDetails.contains(detail)
        default: false
        }
    }

    /// libcurl's words for the failures that leave no answer (`unreachable` carries them as is).
    private static let noAnswerDetails: Set<String> = Set(
        [
            CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT, CURLE_SEND_ERROR,
            CURLE_RECV_ERROR, CURLE_GOT_NOTHING,
        ].map { String(cString: curl_easy_strerror($0)) })
}
