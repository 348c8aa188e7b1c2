import TokenBrokerCore
import TokenBrokerUpstream

/// A generic JSON token endpoint, `source.type: "http"`, for WAF-like and in-house token services.
///
/// Sends the configured request, then finds the token at `tokenPointer` and its lifetime at
/// `expiresInPointer` (seconds) or `expiresAtPointer` (seconds since 1970), else from the JWT's
/// `exp`, else `defaultLifetimeSec`. Header values given as `{"file": …}` are read at every fetch.
public struct HTTPTokenSource: TokenSource {
    public let configuration: HTTPSourceConfiguration
    private let client: UpstreamHTTPClient

    public init(configuration: HTTPSourceConfiguration, client: UpstreamHTTPClient = .shared) {
        self.configuration = configuration
        self.client = client
    }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        var headers: [(String, String)] = [("Accept", "application/json")]
        for (name, value) in configuration.headers.sorted(by: { $0.key < $1.key }) {
            switch value {
            case .value(let text): headers.append((name, text))
            case .file(let path):
                headers.append((name, try SecretFile.readLine(path)))
            }
        }
        let request = UpstreamRequest(
            method: configuration.method, url: configuration.url, headers: headers,
            body: Array((configuration.body ?? "").utf8), settings: configuration.upstream)
        let response = try await client.fetch(request)
        return try token(from: response, now: WallTime())
    }

    /// Reads the token and its lifetime out of an answer.
    public func token(from response: UpstreamResponse, now: WallTime) throws(TokenFetchError) -> FetchedToken {
        let document = JSONValue.object(try TokenEndpointAnswer.document(response))
        guard case .string(let token)? = document.value(atPointer: configuration.tokenPointer),
            TokenEndpointAnswer.isUsableToken(token)
        else {
            throw .badResponse("no usable token at \(configuration.tokenPointer)", httpStatus: response.status)
        }
        var lifetime: Int?
        if let pointer = configuration.expiresInPointer {
            lifetime = try TokenEndpointAnswer.seconds(
                document.value(atPointer: pointer), name: pointer, status: response.status)
        } else if let pointer = configuration.expiresAtPointer, let at = document.value(atPointer: pointer) {
            guard case .number(let seconds) = at else {
                throw .badResponse("\(pointer) is not a number", httpStatus: response.status)
            }
            lifetime = try TokenEndpointAnswer.seconds(
                .number((seconds - now.timeIntervalSince1970).rounded(.down)), name: pointer, status: response.status)
        } else if let expiry = JWTClaims.expiry(of: token) {
            lifetime = try TokenEndpointAnswer.seconds(
                .number(expiry.timeIntervalSince(now).rounded(.down)), name: "exp", status: response.status)
        }
        return FetchedToken(
            accessToken: token, lifetime: (lifetime ?? configuration.defaultLifetimeSec).map { .seconds($0) },
            upstreamStatus: response.status)
    }
}
