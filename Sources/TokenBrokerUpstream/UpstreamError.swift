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
    /// The server could not be reached, or the exchange broke off: refused, reset, no route,
    /// name not resolved, TLS failed. The text is libcurl's.
    case unreachable(String)
    /// No complete answer within the request's timeouts. The text is libcurl's.
    case timeout(String)
    /// The answer's body was longer than `maxResponseBytes` (buffered requests only).
    case tooLarge(limit: Int)
    /// The answer cannot be passed on as it came (streamed exchanges): two different
    /// `Content-Length`s, more header lines than are passed on, a 101. The exchange stopped at
    /// its head and its connection was closed. The text is the client's own, naming no value.
    case badResponse(String)
    /// Stopped on purpose: cancelled, given up by its caller, or its head refused by the delegate.
    case stopped

    /// What libcurl is told when it refuses the settings, for the callers' messages.
    public static let settingsRefusedDetail =
        "libcurl refused the request's settings (check caFile and the client certificate)"
}
