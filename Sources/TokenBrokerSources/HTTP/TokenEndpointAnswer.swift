import TokenBrokerCore

/// Reads an issuer's answer into a token or a classified error, never a bad token.
///
/// | answer | classification |
/// |---|---|
/// | 2xx with a JSON object | the token, if it is there and well formed; else `bad_response` |
/// | 2xx that is not JSON (HTML, text) | `bad_response` |
/// | 3xx | `bad_response`: redirects are not followed |
/// | 400 `invalid_client`, 401, 403 | `credentials_rejected` (some issuers answer a bad secret with 403 and no body) |
/// | 429 | `rate_limited`, with `Retry-After` |
/// | 5xx | `server_error`, with `Retry-After` |
/// | other 4xx | `bad_response`, with the RFC 6749 §5.2 `error` code |
enum TokenEndpointAnswer {
    /// The longest lifetime accepted from an issuer: a year. Longer is treated as a broken answer.
    static let maximumLifetime = 31_536_000

    /// The answer's JSON object, or the classified error for everything else.
    static func document(_ response: UpstreamResponse) throws(TokenFetchError) -> [String: JSONValue] {
        let status = response.status
        switch status {
        case 200..<300:
            guard let document = try? JSONValue(parsing: response.body), case .object(let members) = document else {
                let type = response.headers["content-type"].map { " (Content-Type: \(String($0.prefix(60))))" } ?? ""
                throw .badResponse("the answer is not a JSON object\(type)", httpStatus: status)
            }
            return members
        case 300..<400:
            throw .badResponse("the issuer redirected (\(status)); redirects are not followed for token endpoints", httpStatus: status)
        case 401, 403:
            throw .credentialsRejected(errorSummary(response, fallback: "HTTP \(status)"), httpStatus: status)
        case 429:
            throw .rateLimited(errorSummary(response, fallback: "HTTP 429"), httpStatus: status, retryAfter: response.retryAfter)
        case 500..<600:
            throw .serverError(errorSummary(response, fallback: "HTTP \(status)"), httpStatus: status, retryAfter: response.retryAfter)
        default:
            let summary = errorSummary(response, fallback: "HTTP \(status)")
            if errorCode(response) == "invalid_client" { throw .credentialsRejected(summary, httpStatus: status) }
            throw .badResponse(summary, httpStatus: status)
        }
    }

    /// A token from an OAuth 2.0 answer (RFC 6749 §5.1).
    static func oauthToken(_ response: UpstreamResponse, defaultLifetime: Int) throws(TokenFetchError) -> FetchedToken {
        let members = try document(response)
        guard case .string(let accessToken)? = members["access_token"], isUsableToken(accessToken) else {
            throw .badResponse("the answer has no usable access_token", httpStatus: response.status)
        }
        var tokenType = "Bearer"
        if let value = members["token_type"] {
            guard case .string(let type) = value, !type.isEmpty, type.count <= 32 else {
                throw .badResponse("token_type is not a string", httpStatus: response.status)
            }
            tokenType = type
        }
        let lifetime = try seconds(members["expires_in"], name: "expires_in", status: response.status) ?? defaultLifetime
        var scope: String?
        if case .string(let granted)? = members["scope"] { scope = granted }
        return FetchedToken(
            accessToken: accessToken, tokenType: tokenType, lifetime: .seconds(lifetime), scope: scope, upstreamStatus: response.status)
    }

    /// A lifetime in whole seconds, from a number or a string of digits; nil when absent.
    static func seconds(_ value: JSONValue?, name: String, status: Int) throws(TokenFetchError) -> Int? {
        let number: Double
        switch value {
        case nil, .null?: return nil
        case .number(let given)?: number = given
        case .string(let text)? where Double(text) != nil: number = Double(text)!
        default: throw .badResponse("\(name) is not a number", httpStatus: status)
        }
        guard number.isFinite, number >= 1, number <= Double(maximumLifetime) else {
            throw .badResponse("\(name) \(number) is out of range; allowed: 1–\(maximumLifetime) seconds", httpStatus: status)
        }
        return Int(number)
    }

    /// Visible ASCII only, of a sane length: a token that could not travel in a header is refused.
    static func isUsableToken(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.count <= 16 * 1024 && token.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    private static func errorCode(_ response: UpstreamResponse) -> String? {
        guard case .object(let members)? = try? JSONValue(parsing: response.body), case .string(let code)? = members["error"] else { return nil }
        return code
    }

    /// `error` and a short `error_description` from an RFC 6749 §5.2 answer, printable and short.
    private static func errorSummary(_ response: UpstreamResponse, fallback: String) -> String {
        guard case .object(let members)? = try? JSONValue(parsing: response.body), case .string(let code)? = members["error"] else {
            return fallback
        }
        var summary = "HTTP \(response.status) \(printable(code, limit: 40))"
        if case .string(let description)? = members["error_description"] { summary += ": " + printable(description, limit: 120) }
        return summary
    }

    private static func printable(_ text: String, limit: Int) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7F }.prefix(limit)))
    }
}
