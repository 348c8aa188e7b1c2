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
        if let expiry = JWTClaims.expiry(of: token) {
            let left = expiry.timeIntervalSince(now)
            guard left > 0 else { throw .badResponse("the token in the file expired at \(RFC3339.string(from: expiry))") }
            return FetchedToken(accessToken: token, lifetime: .milliseconds(Int64(left * 1000)))
        }
        return FetchedToken(accessToken: token, lifetime: configuration.lifetimeSec.map { .seconds($0) })
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
