/// What every fetched token must be before a provider accepts it, whatever its source.
///
/// | rule | why |
/// |---|---|
/// | the token: 1–16384 bytes of visible ASCII (`%x21-7E`) | it travels in header fields; a control character, a space or a line break could end one or smuggle another in |
/// | with `setTokenCookie`: RFC 6265 cookie-octets only | `;`, `,`, `"`, `\` would end the cookie, or add attributes such as `Domain=` |
/// | `token_type`: an RFC 6749 type name (`TokenType`) | clients put it in front of the token in `Authorization` |
/// | the lifetime, when there is one: more than 0, at most a year | an already expired token, or one that claims to live for ever, is a broken answer |
/// | the granted scope, when there is one: RFC 6749 §3.3 scope-tokens separated by single spaces, at most 16384 bytes, or empty | it is copied into every answer; a megabyte of it, or bidirectional overrides and BEL, are no scope |
///
/// A token that breaks a rule is a `bad_response` fetch error: the provider keeps its previous
/// token and retries, as for any failed fetch. Sources may refuse earlier with a more precise
/// message (a missing `access_token`, an `exp` out of range), using the same definitions.
public struct TokenRules: Sendable, Equatable {
    /// The longest token accepted, in bytes.
    public static let maximumTokenBytes = 16 * 1024
    /// The longest lifetime accepted: a year, in seconds.
    public static let maximumLifetimeSeconds = 31_536_000
    /// The longest granted scope accepted, in bytes: a token's limit, so that a token and its
    /// scope together stay far inside a store's record (`StoreRecord.maximumSize`, 256 KiB).
    public static let maximumScopeBytes = 16 * 1024

    /// The token must also be a cookie value (the provider's `setTokenCookie`).
    public var cookieSafe: Bool

    public init(cookieSafe: Bool = false) { self.cookieSafe = cookieSafe }

    /// The rules for a provider's tokens, from its configuration.
    public init(for configuration: ProviderConfiguration) {
        self.init(cookieSafe: configuration.cookie.setTokenCookie)
    }

    /// The token unchanged, or the `bad_response` error that says which rule it breaks
    /// (without the token itself, which is never logged).
    public func checked(_ token: FetchedToken) throws(TokenFetchError) -> FetchedToken {
        let value = token.accessToken
        guard !value.isEmpty else { throw .badResponse("the token is empty", httpStatus: token.upstreamStatus) }
        guard value.utf8.count <= Self.maximumTokenBytes else {
            throw .badResponse(
                "the token is longer than \(Self.maximumTokenBytes) bytes", httpStatus: token.upstreamStatus)
        }
        guard Self.isVisibleASCII(value) else {
            throw .badResponse("the token holds a character other than visible ASCII", httpStatus: token.upstreamStatus)
        }
        if cookieSafe, !Self.isCookieValue(value) {
            throw .badResponse(
                "the token holds a character a cookie value cannot (space, '\"', ',', ';' or '\\'), and setTokenCookie is on",
                httpStatus: token.upstreamStatus)
        }
        guard TokenType.normalised(token.tokenType) == token.tokenType else {
            throw .badResponse(
                "token_type is not an RFC 6749 type name (letters, digits, '-', '.', '_'; at most \(TokenType.maximumLength))",
                httpStatus: token.upstreamStatus)
        }
        if let scope = token.scope, !Self.isScope(scope) {
            throw .badResponse(Self.scopeProblem, httpStatus: token.upstreamStatus)
        }
        if let lifetime = token.lifetime {
            guard lifetime > .zero else {
                throw .badResponse("the token has already expired", httpStatus: token.upstreamStatus)
            }
            guard lifetime <= .seconds(Self.maximumLifetimeSeconds) else {
                throw .badResponse(
                    "the token's lifetime is longer than a year (\(Self.maximumLifetimeSeconds) s)",
                    httpStatus: token.upstreamStatus)
            }
        }
        return token
    }

    /// Which rule a store's record breaks, or nil when its token is one this provider would have
    /// accepted from its source.
    ///
    /// A record was checked when it was made, but perhaps not by these rules: another broker of
    /// the fleet, with `setTokenCookie` off or an older version, may have stored a token that
    /// this provider would put in a cookie it could end (`x;Domain=…`), and a file store outlives
    /// a change of the configuration. The lifetime is the record's, from its issue time.
    public func problem(with record: StoredToken) -> String? {
        let lifetime = record.expiresAt.map { Duration.seconds($0.timeIntervalSince(record.issuedAt)) }
        do {
            _ = try checked(
                FetchedToken(
                    accessToken: record.accessToken, tokenType: record.tokenType, lifetime: lifetime,
                    scope: record.scope))
            return nil
        } catch {
            return error.detail
        }
    }

    /// A source whose every token is checked against these rules before it is handed over.
    public func applied(to source: any TokenSource) -> any TokenSource {
        CheckedTokenSource(source: source, rules: self)
    }

    // MARK: - Characters

    /// Only `%x21-7E`: no space, no control character, nothing outside ASCII.
    public static func isVisibleASCII(_ text: String) -> Bool {
        text.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    /// What is wrong with a scope `isScope` refuses, for error details.
    public static let scopeProblem =
        "scope is not an RFC 6749 scope (tokens of visible ASCII but '\"' and '\\', separated by single spaces; at most \(maximumScopeBytes) bytes)"

    /// RFC 6749 §3.3's `scope = scope-token *( SP scope-token )`, `scope-token = 1*( %x21 / %x23-5B
    /// / %x5D-7E )`, at most `maximumScopeBytes`; or empty, as some issuers write "no scope".
    public static func isScope(_ text: String) -> Bool {
        guard text.utf8.count <= maximumScopeBytes else { return false }
        return text.isEmpty
            || text.utf8.split(separator: 0x20, omittingEmptySubsequences: false).allSatisfy {
                !$0.isEmpty && $0.allSatisfy(TokenRequestValues.isScopeCharacter)
            }
    }

    /// A non-empty run of RFC 6265 `cookie-octet`s (§4.1.1), the only cookie values the broker
    /// writes: `%x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E`, that is visible ASCII without
    /// `"`, `,`, `;` and `\`.
    public static func isCookieValue(_ text: String) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { byte in
                byte > 0x20 && byte < 0x7F && byte != 0x22 && byte != 0x2C && byte != 0x3B && byte != 0x5C
            }
    }
}

/// A source whose tokens pass `TokenRules` on their way out.
private struct CheckedTokenSource: TokenSource {
    let source: any TokenSource
    let rules: TokenRules

    func fetch() async throws(TokenFetchError) -> FetchedToken {
        try rules.checked(await source.fetch())
    }
}
