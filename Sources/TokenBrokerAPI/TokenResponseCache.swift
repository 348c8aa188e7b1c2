import Synchronization
import TokenBrokerCore
import TokenBrokerServer

/// Keeps the rendered `/token` answer of one provider, so that it is built once per token
/// version (and once per second of `expires_in`, which must not lie), not once per request.
final class TokenResponseCache: Sendable {
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

    /// The answer for what `summary` saw, from the cache when its key is unchanged; otherwise
    /// rendered from `token()`, which is called only then.
    func response(for summary: CacheSummary, version: UInt64, token: () -> (CachedToken<ContinuousClock.Instant>, Bool)?, now: ContinuousClock.Instant)
        -> HTTPResponse?
    {
        let key = Key(version: version, stale: summary.stale, expiresIn: summary.secondsLeft, renewal: summary.renewal)
        if let hit = current.withLock({ $0?.key == key ? $0?.response : nil }) { return hit }
        guard let (fresh, stale) = token() else { return nil }
        return response(for: fresh, stale: stale, now: now)
    }

    /// The answer for `token`, rendered only when its key changed.
    func response(for token: CachedToken<ContinuousClock.Instant>, stale: Bool, now: ContinuousClock.Instant) -> HTTPResponse {
        let key = Key(version: token.version, stale: stale, expiresIn: TokenResponseBody.secondsLeft(token, at: now), renewal: token.renewal)
        if let hit = current.withLock({ $0?.key == key ? $0?.response : nil }) { return hit }
        let response = Self.render(token, stale: stale, expiresIn: key.expiresIn, provider: providerName, cookie: cookie)
        current.withLock { $0 = Entry(key: key, response: response) }
        return response
    }

    /// Renders one answer without caching it (tokens fetched on demand are each used once).
    static func render(
        _ token: CachedToken<ContinuousClock.Instant>, stale: Bool, expiresIn: Int?, provider: String, cookie: CookieSettings
    ) -> HTTPResponse {
        HTTPResponse(
            status: 200,
            json: TokenResponseBody.render(token, stale: stale, expiresIn: expiresIn, provider: provider, cookie: cookie),
            headers: [("ETag", "\"\(token.version)\"")])
    }
}
