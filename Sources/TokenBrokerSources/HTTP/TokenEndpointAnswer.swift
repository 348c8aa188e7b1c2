import TokenBrokerCore
import TokenBrokerUpstream

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
    /// The longest lifetime accepted from an issuer: a year (`TokenRules`). Longer is treated as
    /// a broken answer.
    static let maximumLifetime = TokenRules.maximumLifetimeSeconds

    /// The answer's JSON object, or the classified error for everything else.
    ///
    /// What the issuer wrote (its `error`, `error_description`, `Content-Type`) goes into the
    /// error's detail, which reaches the log, `/readyz` and callers' 503s: it is cut to printable
    /// ASCII, and each of `secrets` in it (what the request sent: a client secret, an assertion, a
    /// header file's value) becomes `[hidden]`, since an issuer may echo the request it refuses.
    static func document(_ response: UpstreamResponse, hiding secrets: [String] = []) throws(TokenFetchError)
        -> [String: JSONValue]
    {
        let status = response.status
        switch status {
        case 200..<300:
            let type =
                response.headers["content-type"].map { " (Content-Type: \(issuerText($0, secrets, limit: 60)))" } ?? ""
            let document: JSONValue
            do throws(JSONParseError) {
                document = try JSONValue(parsing: response.body)
            } catch {
                // The parser's words (a member given twice, named; where the text went wrong), cut
                // to printable ASCII as all of the issuer's text is.
                throw .badResponse(
                    "the answer is not JSON: \(issuerText(error.description, secrets, limit: 80))\(type)",
                    httpStatus: status)
            }
            guard case .object(let members) = document else {
                throw .badResponse("the answer is not a JSON object\(type)", httpStatus: status)
            }
            return members
        case 300..<400:
            throw .badResponse(
                "the issuer redirected (\(status)); redirects are not followed for token endpoints", httpStatus: status)
        case 401, 403:
            throw .credentialsRejected(errorSummary(response, secrets, fallback: "HTTP \(status)"), httpStatus: status)
        case 429:
            throw .rateLimited(
                errorSummary(response, secrets, fallback: "HTTP 429"), httpStatus: status,
                retryAfter: response.retryAfter)
        case 500..<600:
            throw .serverError(
                errorSummary(response, secrets, fallback: "HTTP \(status)"), httpStatus: status,
                retryAfter: response.retryAfter)
        default:
            let summary = errorSummary(response, secrets, fallback: "HTTP \(status)")
            if errorCode(response) == "invalid_client" { throw .credentialsRejected(summary, httpStatus: status) }
            throw .badResponse(summary, httpStatus: status)
        }
    }

    /// A token from an OAuth 2.0 answer (RFC 6749 §5.1), read at `now` (`lifetime`).
    static func oauthToken(
        _ response: UpstreamResponse, defaultLifetime: Int, now: WallTime, hiding secrets: [String] = []
    ) throws(TokenFetchError) -> FetchedToken {
        let members = try document(response, hiding: secrets)
        guard case .string(let accessToken)? = members["access_token"], isUsableToken(accessToken) else {
            throw .badResponse("the answer has no usable access_token", httpStatus: response.status)
        }
        var tokenType = "Bearer"
        if let value = members["token_type"] {
            guard case .string(let type) = value, let normalised = TokenType.normalised(type) else {
                throw .badResponse(
                    "token_type is not an RFC 6749 type name (letters, digits, '-', '.', '_'; at most \(TokenType.maximumLength))",
                    httpStatus: response.status)
            }
            tokenType = normalised
        }
        let lifetime = try lifetime(
            stated: seconds(members["expires_in"], name: "expires_in", status: response.status), of: accessToken,
            default: defaultLifetime, now: now, status: response.status)
        // Copied into every answer for this token: bounded and printable, as RFC 6749 §3.3 writes it.
        var scope: String?
        switch members["scope"] {
        case nil, .null?: break
        case .string(let granted)? where TokenRules.isScope(granted): scope = granted
        default: throw .badResponse(TokenRules.scopeProblem, httpStatus: response.status)
        }
        return FetchedToken(
            accessToken: accessToken, tokenType: tokenType, lifetime: lifetime, scope: scope,
            upstreamStatus: response.status)
    }

    /// A token's lifetime at `now`: the one the answer states (`expires_in`, or what the generic
    /// source's pointers find), else the JWT's `exp`, else `defaultLifetime`; nil for no expiry.
    ///
    /// A stated lifetime is taken as it is, even for a JWT: it counts from the answer, so the
    /// issuer's clock and the broker's need not agree. Without one, a JWT's `exp` gives it, not
    /// the default: a JWT is never served past the expiry it carries, and one whose `exp` is
    /// already past is a `bad_response`. A token that looks like a JWT but is not one (a repeated
    /// claim, an `exp` that is a string) is a `bad_response` either way (`JWTClaims.expiry`).
    static func lifetime(stated: Int?, of token: String, default defaultLifetime: Int?, now: WallTime, status: Int)
        throws(TokenFetchError) -> Duration?
    {
        do throws(TokenFetchError) {
            if let stated {
                _ = try JWTClaims.expiry(of: token)
                return .seconds(stated)
            }
            return try JWTClaims.lifetime(of: token, at: now) ?? defaultLifetime.map { .seconds($0) }
        } catch {
            throw .badResponse(error.detail, httpStatus: status)
        }
    }

    /// A lifetime in whole seconds, 1 to `maximumLifetime`; nil when absent.
    ///
    /// RFC 6749 §A.14 writes `expires_in` as `1*DIGIT`: a JSON number written as digits alone
    /// (`300`, not `300.0`, `3e2`, `3.0e2` or `300.5`, whose values may be whole:
    /// `JSONNumber.isDigits`), or a string of ASCII digits only (`"300"`, not `"+300"`, `"3e2"`,
    /// `"0x1p4"` or `" 300"`). Anything else is a `bad_response`.
    static func seconds(_ value: JSONValue?, name: String, status: Int) throws(TokenFetchError) -> Int? {
        let whole: Int
        switch value {
        case nil, .null?:
            return nil
        case .number(let number)? where number.isDigits:
            return try seconds(number.value, name: name, status: status)
        case .string(let text)?:
            guard let number = digits(text) else {
                throw .badResponse(
                    "\(name) is a string other than digits; allowed: a whole number of seconds", httpStatus: status)
            }
            whole = number
        default:
            throw .badResponse("\(name) is not a whole number of seconds written as digits", httpStatus: status)
        }
        guard (1...maximumLifetime).contains(whole) else {
            throw .badResponse(
                "\(name) \(whole) is out of range; allowed: 1–\(maximumLifetime) seconds", httpStatus: status)
        }
        return whole
    }

    /// `seconds` as a lifetime, 1 to `maximumLifetime`: checked before it is converted, so that
    /// `1e300` is a `bad_response`, never a trap.
    static func seconds(_ seconds: Double, name: String, status: Int) throws(TokenFetchError) -> Int {
        guard let exact = Int(exactly: seconds), (1...maximumLifetime).contains(exact) else {
            throw .badResponse(
                "\(name) \(seconds) is out of range; allowed: 1–\(maximumLifetime) seconds", httpStatus: status)
        }
        return exact
    }

    /// `1*DIGIT` as a number; nil for anything else, or for more digits than a lifetime needs.
    private static func digits(_ text: String) -> Int? {
        guard (1...18).contains(text.utf8.count), text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else {
            return nil
        }
        return Int(text)
    }

    /// Visible ASCII only, of a sane length (`TokenRules`): a token that could not travel in a
    /// header is refused.
    static func isUsableToken(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.count <= TokenRules.maximumTokenBytes && TokenRules.isVisibleASCII(token)
    }

    private static func errorCode(_ response: UpstreamResponse) -> String? {
        guard case .object(let members)? = try? JSONValue(parsing: response.body),
            case .string(let code)? = members["error"]
        else { return nil }
        return code
    }

    /// `error` and a short `error_description` from an RFC 6749 §5.2 answer, printable and short,
    /// with `secrets` hidden.
    private static func errorSummary(_ response: UpstreamResponse, _ secrets: [String], fallback: String) -> String {
        guard case .object(let members)? = try? JSONValue(parsing: response.body),
            case .string(let code)? = members["error"]
        else {
            return fallback
        }
        var summary = "HTTP \(response.status) \(issuerText(code, secrets, limit: 40))"
        if case .string(let description)? = members["error_description"] {
            summary += ": " + issuerText(description, secrets, limit: 120)
        }
        return summary
    }

    /// Text from the issuer as it may be shown: each of `secrets` as `[hidden]`, then printable
    /// ASCII only (no C0, DEL, C1 or other non-ASCII, which could move a terminal's cursor), at
    /// most `limit` characters. The secrets are hidden in the text as it came (a secret may hold
    /// non-ASCII), and `String.hiding` finds one through any character that is not visible ASCII
    /// and in either case: a zero-width space or a control character inside a secret, which the
    /// filter drops, cannot bring it back whole.
    static func issuerText(_ text: String, _ secrets: [String], limit: Int) -> String {
        String(
            String.UnicodeScalarView(
                text.hiding(secrets).unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7F }.prefix(limit)))
    }
}
