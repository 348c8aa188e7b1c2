import TokenBrokerCore
import TokenBrokerUpstream

/// A generic JSON token endpoint, `source.type: "http"`, for WAF-like and in-house token services.
///
/// Sends the configured request, then finds the token at `tokenPointer` and its lifetime at
/// `expiresInPointer` (seconds) or `expiresAtPointer` (seconds since 1970), else from the JWT's
/// `exp`, else `defaultLifetimeSec`. Header values given as `{"file": …}` are read at every fetch.
///
/// As a template's source, a child puts its values in the placeholders of the URL, header values
/// and body (`{{audience}}`, `{{scope}}`, `{{resource}}`; see `HTTPSourceConfiguration`).
public struct HTTPTokenSource: TemplatedTokenSource {
    public let configuration: HTTPSourceConfiguration
    private let client: UpstreamHTTPClient
    /// The request cut at its placeholders, shared with the children; a failure for placeholders
    /// the configuration check would have refused (a configuration made in code).
    private let template: Result<HTTPRequestTemplate, TokenFetchError>
    public let values: TokenRequestValues

    public init(configuration: HTTPSourceConfiguration, client: UpstreamHTTPClient = .shared) {
        self.configuration = configuration
        self.client = client
        do {
            template = .success(try HTTPRequestTemplate(configuration))
        } catch {
            template = .failure(error)
        }
        values = .none
    }

    private init(child values: TokenRequestValues, of template: HTTPTokenSource) {
        configuration = template.configuration
        client = template.client
        self.template = template.template
        self.values = values
    }

    /// A source that puts `values` in this one's placeholders.
    public func child(for values: TokenRequestValues) -> HTTPTokenSource {
        HTTPTokenSource(child: values, of: self)
    }

    public func fetch() async throws(TokenFetchError) -> FetchedToken {
        let request = try request()
        let response = try await client.fetch(request)
        return try token(from: response, now: WallTime(), hiding: secrets(in: request))
    }

    /// The values of the headers read from files, as `request` sends them: secrets (API keys and
    /// the like) that an issuer's answer must not repeat.
    func secrets(in request: UpstreamRequest) -> [String] {
        request.headers.compactMap { name, value in
            guard case .file(_)? = configuration.headers[name] else { return nil }
            return String(decoding: value, as: UTF8.self)
        }
    }

    /// The request, with this source's values in the placeholders, ready to send.
    public func request() throws(TokenFetchError) -> UpstreamRequest {
        try template.get().request(values: values, configuration: configuration)
    }

    /// Reads the token and its lifetime out of an answer; each of `secrets` in the issuer's words
    /// becomes `[hidden]`.
    public func token(from response: UpstreamResponse, now: WallTime, hiding secrets: [String] = [])
        throws(TokenFetchError) -> FetchedToken
    {
        let document = JSONValue.object(try TokenEndpointAnswer.document(response, hiding: secrets))
        guard case .string(let token)? = document.value(atPointer: configuration.tokenPointer),
            TokenEndpointAnswer.isUsableToken(token)
        else {
            throw .badResponse("no usable token at \(configuration.tokenPointer)", httpStatus: response.status)
        }
        var stated: Int?
        if let pointer = configuration.expiresInPointer {
            stated = try TokenEndpointAnswer.seconds(
                document.value(atPointer: pointer), name: pointer, status: response.status)
        } else if let pointer = configuration.expiresAtPointer, let at = document.value(atPointer: pointer), at != .null
        {
            guard case .number(let seconds) = at else {
                throw .badResponse("\(pointer) is not a number", httpStatus: response.status)
            }
            stated = try TokenEndpointAnswer.seconds(
                (seconds.value - now.timeIntervalSince1970).rounded(.down), name: pointer, status: response.status)
        }
        // An answer without the configured member, or with null there, falls back to the JWT's
        // exp, whichever pointer is configured (`TokenEndpointAnswer.lifetime`).
        let lifetime = try TokenEndpointAnswer.lifetime(
            stated: stated, of: token, default: configuration.defaultLifetimeSec, now: now, status: response.status)
        return FetchedToken(accessToken: token, lifetime: lifetime, upstreamStatus: response.status)
    }
}
