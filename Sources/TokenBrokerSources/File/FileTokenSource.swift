import TokenBrokerCore

/// A token file that someone else keeps fresh (`source.type: "file"`): a Kubernetes projected
/// service-account token, a Vault Agent sink.
///
/// Every fetch reads the file again, so a replaced file is picked up at the next refresh. The
/// expiry comes from the JWT's `exp` claim when the token is a JWT, else from `lifetimeSec`.
public struct FileTokenSource: TokenSource {
    public let configuration: FileSourceConfiguration

    public init(configuration: FileSourceConfiguration) { self.configuration = configuration }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        try read(now: WallTime())
    }

    /// Reads the file and works out the token's lifetime at `now`.
    public func read(now: WallTime) throws(TokenFetchError) -> FetchedToken {
        // Never waits: a FIFO, a device or a directory at the path is refused, not read.
        let bytes: [UInt8]
        switch FileContents.read(configuration.path, limit: 64 * 1024) {
        case .success(let contents): bytes = contents
        case .failure(let error) where error.isTooLarge: throw .badResponse("the token file is larger than 64 KiB")
        case .failure(let error): throw .unreachable("cannot read the token file \(configuration.path): \(error.reason)")
        }
        guard bytes.count <= 64 * 1024 else { throw .badResponse("the token file is larger than 64 KiB") }
        guard let text = String(validating: bytes, as: UTF8.self) else { throw .badResponse("the token file is not UTF-8") }
        let token = text.trimmingWhitespace
        guard !token.isEmpty else { throw .badResponse("the token file is empty") }
        guard !token.contains(where: { $0.isWhitespace || $0.isNewline }) else {
            throw .badResponse("the token file holds more than one word")
        }
        // The token's characters, length and lifetime are checked by the provider (`TokenRules`),
        // as for every source.
        let lifetime = try JWTClaims.lifetime(of: token, at: now) ?? configuration.lifetimeSec.map { .seconds($0) }
        return FetchedToken(accessToken: token, lifetime: lifetime)
    }
}

/// Reads claims of a JWT without verifying it: the broker hands tokens on, it does not judge them.
public enum JWTClaims {
    /// The `exp` claim of a compact JWS, or nil when the token is not a JWT with one.
    public static func expiry(of token: String) -> WallTime? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64URL.decode(parts[1]),
            case .object(let claims)? = try? JSONValue(parsing: payload), case .number(let exp)? = claims["exp"]
        else { return nil }
        return WallTime(timeIntervalSince1970: exp)
    }

    /// How long the token lives from `now` by its `exp` claim; nil when it is not a JWT with one.
    ///
    /// `exp` is whatever number the token's writer put there (`1e16`, `-1e300`), so it is
    /// checked before it becomes a duration: a token already expired, or one that claims to
    /// live longer than `TokenRules.maximumLifetimeSeconds`, is a `bad_response`.
    public static func lifetime(of token: String, at now: WallTime) throws(TokenFetchError) -> Duration? {
        guard let expiry = expiry(of: token) else { return nil }
        let left = expiry.timeIntervalSince(now)
        guard left > 0 else {
            let when = expiry.wholeSecondsSince1970 != nil ? "at \(RFC3339.string(from: expiry))" : "(exp \(expiry.timeIntervalSince1970))"
            throw .badResponse("the token expired \(when)")
        }
        guard left <= Double(TokenRules.maximumLifetimeSeconds), let lifetime = Duration.checkedSeconds(left) else {
            throw .badResponse("the token's exp is more than a year away (exp \(expiry.timeIntervalSince1970)); allowed: at most \(TokenRules.maximumLifetimeSeconds) s")
        }
        return lifetime
    }
}

extension String {
    fileprivate var trimmingWhitespace: String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !$0.properties.isWhitespace }),
            let last = scalars.lastIndex(where: { !$0.properties.isWhitespace })
        else { return "" }
        return String(scalars[first...last])
    }
}
