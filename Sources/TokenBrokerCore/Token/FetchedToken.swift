/// A token as a source hands it over, before the provider stamps it with a version.
public struct FetchedToken: Sendable, Equatable {
    /// The secret itself. Never log it: log `TokenFingerprint` instead.
    public var accessToken: String
    /// OAuth 2.0's `token_type`, normalised (`TokenType`) so that `bearer` reads `Bearer`. A
    /// name that is not a type name is kept as given, for `TokenRules` to refuse.
    public var tokenType: String
    /// How long the token lives from the moment it was fetched, or nil when it does not say.
    public var lifetime: Duration?
    /// The granted scope, when the issuer told it.
    public var scope: String?
    /// The issuer's HTTP status, for sources that speak HTTP (for metrics).
    public var upstreamStatus: Int?

    public init(
        accessToken: String, tokenType: String = "Bearer", lifetime: Duration?, scope: String? = nil,
        upstreamStatus: Int? = nil
    ) {
        self.upstreamStatus = upstreamStatus
        self.accessToken = accessToken
        self.tokenType = TokenType.normalised(tokenType) ?? tokenType
        self.lifetime = lifetime
        self.scope = scope
    }
}

/// A token the provider has accepted: versioned, with its times on the provider's clock.
public struct CachedToken<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    public var token: FetchedToken
    /// Grows by one with every token the provider accepts, starting at 1.
    public var version: UInt64
    /// When it was fetched, on the provider's clock.
    public var issuedAt: Instant
    /// When it stops being valid, on the provider's clock; nil for a token without expiry.
    public var expiresAt: Instant?
    /// When it was fetched, by the wall clock, for `issued_at` and `expires_at`.
    public var issuedAtDate: WallTime
    /// Grows by one each time the same token comes back with a new expiry (same version), so
    /// that an answer rendered with the old expiry is not served again.
    public var renewal: UInt64 = 0

    /// Whether the token may still be handed out at `now`.
    public func isValid(at now: Instant) -> Bool {
        guard let expiresAt else { return true }
        return now < expiresAt
    }

    /// Whole seconds it has left at `now`, as `expires_in` and `Max-Age` show them
    /// (`Duration.secondsLeft`); nil for a token without expiry. The one place its remaining life is computed.
    public func secondsLeft(at now: Instant) -> Int? {
        expiresAt.map { now.duration(to: $0).secondsLeft }
    }
}

extension Duration {
    /// A remaining life in whole seconds, as `expires_in` and `Max-Age` show it: a fraction counts
    /// as a whole second (0.3 s reads 1), so that a token still valid never reads 0, which would
    /// say it has expired. 0 once the duration is not positive: a provider hands a token out only
    /// while `now < expiresAt` (`CachedToken.isValid`), so it then has none.
    public var secondsLeft: Int { self > .zero ? Int(clamping: secondsRoundedUp) : 0 }
}

extension CachedToken {
    /// When it expires by the wall clock, or nil for a token without expiry.
    public var expiresAtDate: WallTime? {
        token.lifetime.map { issuedAtDate.addingTimeInterval($0.inSeconds) }
    }
}
