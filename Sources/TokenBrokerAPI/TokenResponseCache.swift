import Synchronization
import TokenBrokerCore
import TokenBrokerServer

/// What a token answer looks like: the broker's own `/token` body, or a cloud SDK protocol's
/// (`CompatAPI`). A cache keeps one rendered answer per format.
public enum AnswerFormat: Int, CaseIterable, Sendable {
    case broker
    case gceToken
    case gceIdentity
    case azureAppService
    case azureIMDS
}

/// Keeps the rendered token answers of one provider, one per `AnswerFormat`, so that each is
/// built once per token version (and once per second of `expires_in`, which must not lie), not
/// once per request.
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

    /// One slot per `AnswerFormat`, by its raw value.
    private let current = Lock<[Entry?]>(Array(repeating: nil, count: AnswerFormat.allCases.count))
    private let providerName: String
    private let cookie: CookieSettings
    /// The newest version a compatibility route forced a refresh of, for being inside an SDK's
    /// expiry margin (`CompatAPI`); each version is refreshed so at most once.
    private let marginRefreshed = Atomic<UInt64>(0)

    init(providerName: String, cookie: CookieSettings) {
        self.providerName = providerName
        self.cookie = cookie
    }

    /// An empty cache for `provider`'s answers.
    public convenience init<Provider: TokenProviding>(for provider: Provider) where Provider.Instant == Instant {
        self.init(providerName: provider.name, cookie: provider.cookie)
    }

    /// The `/token` answer for `token` with `secondsLeft` (as the provider's read returned
    /// them), from the cache when its key is unchanged; rendered, and kept, only when it changed.
    func response(for token: CachedToken<Instant>, stale: Bool, secondsLeft: Int?) -> HTTPResponse {
        response(for: token, stale: stale, secondsLeft: secondsLeft, format: .broker) { [providerName, cookie] in
            Self.render(token, stale: stale, expiresIn: secondsLeft, provider: providerName, cookie: cookie)
        }
    }

    /// The answer in `format` for `token` with `secondsLeft`, from the cache when its key is
    /// unchanged; else made by `render` and kept. A format's answer must depend only on the
    /// token, `stale` and `secondsLeft` (and on what never changes for this provider).
    func response(
        for token: CachedToken<Instant>, stale: Bool, secondsLeft: Int?, format: AnswerFormat,
        render: () -> HTTPResponse
    ) -> HTTPResponse {
        let key = Key(version: token.version, stale: stale, expiresIn: secondsLeft, renewal: token.renewal)
        let slot = format.rawValue
        if let hit = current.withLock({ $0[slot]?.key == key ? $0[slot]?.response : nil }) { return hit }
        let response = render()
        current.withLock { $0[slot] = Entry(key: key, response: response) }
        return response
    }

    /// Whether this call is the first to claim a margin refresh of `version` (or a newer one).
    func claimMarginRefresh(of version: UInt64) -> Bool {
        var seen = marginRefreshed.load(ordering: .relaxed)
        while seen < version {
            let (exchanged, original) = marginRefreshed.compareExchange(
                expected: seen, desired: version, ordering: .relaxed)
            if exchanged { return true }
            seen = original
        }
        return false
    }

    /// The `/token` answer for `token` at `now`, rendered only when its key changed.
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
