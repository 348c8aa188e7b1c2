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
        case .failure(let error):
            throw .unreachable("cannot read the token file \(configuration.path): \(error.reason)")
        }
        guard bytes.count <= 64 * 1024 else { throw .badResponse("the token file is larger than 64 KiB") }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw .badResponse("the token file is not UTF-8")
        }
        let token = text.trimmingWhitespace()
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
