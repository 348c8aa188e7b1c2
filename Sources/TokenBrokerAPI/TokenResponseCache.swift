import Synchronization
import TokenBrokerCore
import TokenBrokerServer

/// Keeps the rendered `/token` answer of one provider, so that it is built once per token
/// version (and once per second of `expires_in`, which must not lie), not once per request.
///
/// Public so that whoever makes a template's children can keep one beside each child (the
/// template's attachment, `TemplateProviding`); the routes alone read it.
public final class TokenResponseCache<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    private struct Key: Equatable {
        var version: UInt64
        var stale: Bool
        var expiresIn: Int?
        /// The same token with a new expiry renders a new `expires_at`.
        var renewal: UInt64
    }

    private struct Entry {
        var key: Key
        var response: HTTPResponse
    }

    private let current = Lock<Entry?>(nil)
    private let providerName: String
    private let cookie: CookieSettings

    init(providerName: String, cookie: CookieSettings) {
        self.providerName = providerName
        self.cookie = cookie
    }

    /// An empty cache for `provider`'s answers.
    public convenience init<Provider: TokenProviding>(for provider: Provider) where Provider.Instant == Instant {
        self.init(providerName: provider.name, cookie: provider.cookie)
    }

    /// The answer for `token` with `secondsLeft` (as the provider's read returned them), from
    /// the cache when its key is unchanged; rendered, and kept, only when it changed.
    func response(for token: CachedToken<Instant>, stale: Bool, secondsLeft: Int?) -> HTTPResponse {
        let key = Key(version: token.version, stale: stale, expiresIn: secondsLeft, renewal: token.renewal)
        if let hit = current.withLock({ $0?.key == key ? $0?.response : nil }) { return hit }
        let response = Self.render(token, stale: stale, expiresIn: secondsLeft, provider: providerName, cookie: cookie)
        current.withLock { $0 = Entry(key: key, response: response) }
        return response
    }

    /// The answer for `token` at `now`, rendered only when its key changed.
    func response(for token: CachedToken<Instant>, stale: Bool, now: Instant) -> HTTPResponse {
        response(for: token, stale: stale, secondsLeft: token.secondsLeft(at: now))
    }

    /// Renders one answer without caching it (tokens fetched on demand are each used once).
    static func render(
        _ token: CachedToken<Instant>, stale: Bool, expiresIn: Int?, provider: String, cookie: CookieSettings
    ) -> HTTPResponse {
        HTTPResponse(
            status: 200,
            json: TokenResponseBody.render(
                token, stale: stale, expiresIn: expiresIn, provider: provider, cookie: cookie),
            headers: [("ETag", "\"\(token.version)\"")])
    }
}
