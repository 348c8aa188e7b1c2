import TokenBrokerCore

/// One request to an issuer, and what the client enforces on it.
public struct UpstreamRequest: Sendable {
    public var method: String = "POST"
    public var url: String
    /// Names and values; a value is the bytes sent, so that the proxy passes on a value that is
    /// not UTF-8 as it came (obs-text, RFC 9110 §5.5), where a string would have replaced it.
    public var headers: [(String, [UInt8])] = []
    /// Headers the client library would add of its own accord (`Accept`, `Content-Type`) that are
    /// not to be sent. (`Expect` never is.)
    public var withheld: [String] = []
    public var body: [UInt8] = []
    /// TLS and limits, usually shared by every request of a source.
    public var settings: UpstreamConfiguration
    /// Connect to this Unix socket instead of the URL's host (the URL still gives path and `Host`).
    public var unixSocketPath: String?
    /// Go to the server directly, never through a proxy from the environment (`http_proxy`,
    /// `HTTPS_PROXY`, `ALL_PROXY`): for the broker's own commands asking the broker.
    public var bypassesProxies = false

    public init(
        method: String = "POST", url: String, headers: [(String, String)] = [], body: [UInt8] = [],
        settings: UpstreamConfiguration
    ) {
        self.method = method
        self.url = url
        self.headers = headers.map { ($0.0, Array($0.1.utf8)) }
        self.body = body
        self.settings = settings
    }
}

/// An issuer's answer.
public struct UpstreamResponse: Sendable {
    public var status: Int
    /// Header names in lower case.
    public var headers: [String: String]
    public var body: [UInt8]

    public init(status: Int, headers: [String: String] = [:], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// `Retry-After` (RFC 9110 §10.2.3), in seconds or as an HTTP date in any of its three forms,
    /// at most an hour.
    public var retryAfter: Duration? { retryAfter(now: WallTime()) }

    /// `retryAfter`, with a date read against `now`.
    public func retryAfter(now: WallTime) -> Duration? {
        guard let text = headers["retry-after"]?.trimmingCharacters(in: " \t") else { return nil }
        if !text.isEmpty, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) {
            // delay-seconds = 1*DIGIT; more digits than an Int holds is still "a long time".
            return .seconds(min(Int(text) ?? 3600, 3600))
        }
        guard let date = HTTPDate.parse(text, now: now) else { return nil }
        return .seconds(Int64(rounding: min(max(date.timeIntervalSince(now), 0), 3600), .up) ?? 0)
    }
}
