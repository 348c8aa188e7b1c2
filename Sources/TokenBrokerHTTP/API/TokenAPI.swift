import TokenBrokerCore

/// The token listener's routes.
///
/// | route | answer |
/// |---|---|
/// | `GET /token` | the default provider's token |
/// | `GET /providers/{name}/token` | a named provider's token |
/// | `GET /.well-known/jwks.json` | the local signers' public keys |
public final class TokenAPI: HTTPHandler {
    public typealias Provider = TokenProvider<ContinuousClock>

    struct Endpoint: Sendable {
        let provider: Provider
        let responses: TokenResponseCache
    }

    private let endpoints: [String: Endpoint]
    private let defaultEndpoint: Endpoint
    private let jwks: HTTPResponse
    private let maxWait: Duration

    /// - Parameters:
    ///   - providers: the providers; the first answers `/token`.
    ///   - jwks: the JWK Set document to publish.
    ///   - maxWait: how long a request may wait for a token fetched on demand.
    public init(providers: [Provider], jwks: String, maxWait: Duration) {
        precondition(!providers.isEmpty, "the broker needs at least one provider")
        var endpoints: [String: Endpoint] = [:]
        for provider in providers {
            endpoints[provider.name] = Endpoint(provider: provider, responses: TokenResponseCache(providerName: provider.name))
        }
        self.endpoints = endpoints
        defaultEndpoint = endpoints[providers[0].name]!
        self.jwks = HTTPResponse(status: 200, json: jwks, headers: [("Cache-Control", "public, max-age=300")])
        self.maxWait = maxWait
    }

    public func handle(_ request: HTTPRequest) -> HTTPReply {
        let path = request.path
        if path == "/.well-known/jwks.json" {
            return Self.only(["GET", "HEAD"], request) ?? .response(jwks)
        }
        let endpoint: Endpoint
        let rest: Substring
        if path.hasPrefix("/providers/") {
            let tail = path.dropFirst("/providers/".count)
            guard let slash = tail.firstIndex(of: "/") else { return .response(Responses.notFound(path)) }
            let name = String(tail[..<slash])
            guard let named = endpoints[name] else {
                return .response(.error(404, "unknown_provider", "no provider is named \"\(name)\""))
            }
            endpoint = named
            rest = tail[slash...]
        } else {
            endpoint = defaultEndpoint
            rest = Substring(path)
        }
        switch rest {
        case "/token":
            return Self.only(["GET", "HEAD"], request) ?? token(endpoint)
        default:
            return .response(Responses.notFound(path))
        }
    }

    // MARK: - Routes

    private func token(_ endpoint: Endpoint) -> HTTPReply {
        let provider = endpoint.provider
        guard !provider.configuration.backgroundRefreshEnabled else {
            guard let (token, stale) = provider.cachedToken() else { return .response(unavailable(provider)) }
            return .response(endpoint.responses.response(for: token, stale: stale, now: provider.clock.now))
        }
        // On demand: fetch while the connection waits suspended, never on this thread.
        let maxWait = self.maxWait
        return .deferred { responder in
            let id = provider.addWaiter(after: nil, deadline: provider.deadline(in: maxWait), onDemand: true) { outcome in
                responder.respond(Self.answer(outcome, provider: provider))
            }
            responder.onClose { provider.removeWaiter(id) }
        }
    }

    private static func answer(_ outcome: Provider.WaitOutcome, provider: Provider) -> HTTPResponse {
        let now = provider.clock.now
        func render(_ token: Provider.Token, stale: Bool) -> HTTPResponse {
            TokenResponseCache.render(
                token, stale: stale, expiresIn: TokenResponseBody.secondsLeft(token, at: now), provider: provider.name)
        }
        switch outcome {
        case .token(let token, let stale): return render(token, stale: stale)
        case .exhausted(previous: let token?, lastError: _): return render(token, stale: true)
        case .shuttingDown: return Responses.shuttingDown
        default: return unavailableResponse(provider)
        }
    }

    private func unavailable(_ provider: Provider) -> HTTPResponse { Self.unavailableResponse(provider) }

    static func unavailableResponse(_ provider: Provider) -> HTTPResponse {
        let status = provider.status()
        var description = "provider \"\(provider.name)\" has no valid token"
        if let error = status.lastError { description += "; last upstream error: \(error.summary)" }
        if status.phase == "paused" { description += "; refresh was paused while idle, wait for one at /token/ready" }
        return .error(503, "token_unavailable", description, headers: [("Retry-After", "1")])
    }

    /// Nil when the method is allowed, else the 405 answer with `Allow`.
    static func only(_ methods: [String], _ request: HTTPRequest) -> HTTPReply? {
        guard !methods.contains(request.method) else { return nil }
        return .response(Responses.methodNotAllowed(request.method, allow: methods))
    }
}
