/// Where a provider gets its tokens: the local signer, an OAuth 2.0 issuer, a file, and so on.
///
/// - Important: `fetch()` may take as long as the issuer does, and is always called from a task
///   of its own, never from a server thread.
public protocol TokenSource: Sendable {
    /// Fetches one new token, or throws a `TokenFetchError` that says what went wrong.
    func fetch() async throws(TokenFetchError) -> FetchedToken
}

/// Why a fetch failed, classified so that logs, metrics and answers can say it plainly.
///
/// `description` is short and free of payload, fit for a metric label; `detail` adds what the
/// issuer said, and never holds a secret.
public struct TokenFetchError: Error, Sendable, Equatable, CustomStringConvertible {
    private enum Code: String, Sendable {
        case unreachable, timeout
        case credentialsRejected = "credentials_rejected"
        case rateLimited = "rate_limited"
        case serverError = "server_error"
        case badResponse = "bad_response"
        case configuration
        case internalError = "internal"
    }

    private let code: Code
    /// What the issuer said or what failed, free of secrets.
    public let detail: String
    /// The upstream HTTP status, when there was one.
    public let httpStatus: Int?
    /// The issuer's `Retry-After`, when it sent one.
    public let retryAfter: Duration?

    private init(_ code: Code, _ detail: String, httpStatus: Int? = nil, retryAfter: Duration? = nil) {
        self.code = code
        self.detail = detail
        self.httpStatus = httpStatus
        self.retryAfter = retryAfter
    }

    /// The issuer could not be reached: refused, reset, no route, name not resolved.
    public static func unreachable(_ detail: String) -> Self { .init(.unreachable, detail) }
    /// The issuer did not answer in time.
    public static func timeout(_ detail: String) -> Self { .init(.timeout, detail) }
    /// The issuer refused the credentials (400 `invalid_client`, 401, 403).
    public static func credentialsRejected(_ detail: String, httpStatus: Int?) -> Self {
        .init(.credentialsRejected, detail, httpStatus: httpStatus)
    }
    /// The issuer asked us to slow down (429).
    public static func rateLimited(_ detail: String, httpStatus: Int?, retryAfter: Duration?) -> Self {
        .init(.rateLimited, detail, httpStatus: httpStatus, retryAfter: retryAfter)
    }
    /// The issuer failed (5xx).
    public static func serverError(_ detail: String, httpStatus: Int?, retryAfter: Duration? = nil) -> Self {
        .init(.serverError, detail, httpStatus: httpStatus, retryAfter: retryAfter)
    }
    /// The issuer answered, but not with a usable token.
    public static func badResponse(_ detail: String, httpStatus: Int? = nil) -> Self {
        .init(.badResponse, detail, httpStatus: httpStatus)
    }
    /// The source is misconfigured: a missing key file, an unreadable secret.
    public static func configuration(_ detail: String) -> Self { .init(.configuration, detail) }
    /// Something failed inside the broker itself.
    public static func internalError(_ detail: String) -> Self { .init(.internalError, detail) }

    /// The classification, such as `credentials_rejected`: short, stable, fit for a metric label.
    public var description: String { code.rawValue }
    /// The classification and the detail, for logs and error descriptions.
    public var summary: String { detail.isEmpty ? code.rawValue : "\(code.rawValue): \(detail)" }
}

extension Result {
    /// The error, or nil for a success.
    public var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
