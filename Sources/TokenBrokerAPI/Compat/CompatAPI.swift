import Glibc
import TokenBrokerCore
import TokenBrokerServer

/// Which cloud SDK protocol an answer follows.
public enum CompatProtocol: String, Sendable {
    /// Google's metadata server (`GCE_METADATA_HOST`).
    case gce
    /// Azure managed identity: App Service (`IDENTITY_ENDPOINT`) and IMDS (`AZURE_POD_IDENTITY_AUTHORITY_HOST`).
    case azure

    /// The header every metadata server answer carries, and every request must.
    static let metadataFlavor = ("Metadata-Flavor", "Google")
}

/// The cloud SDKs' own token protocols, so that an application using a stock SDK gets the
/// broker's tokens by setting an environment variable:
///
/// | route | protocol |
/// |---|---|
/// | `GET /`, `GET /computeMetadata/v1/…` | Google's metadata server (`CompatAPI+GCE.swift`) |
/// | `GET /msi/token` | Azure App Service managed identity, 2019-08-01 (`CompatAPI+Azure.swift`) |
/// | `GET /metadata/identity/oauth2/token` | Azure IMDS managed identity, 2018-02-01 (`CompatAPI+Azure.swift`) |
///
/// Tokens come from templates (`perRequest`): the SDKs ask by scope, audience or resource, and
/// each distinct request is a child, as for `/providers/{name}/token`. A child's first request
/// waits for its first token. Each answer is rendered once per token version (and second of
/// `expires_in`), in the child's `TokenResponseCache`, beside its `/token` answer.
///
/// The caller keys and the request guard do not apply: the SDKs cannot send them. These
/// routes' guards are the protocols' own headers (`Metadata-Flavor: Google`, `Metadata: true`,
/// App Service's secret `X-IDENTITY-HEADER`), the refusal of `X-Forwarded-For` and `Forwarded` and, on a
/// loopback listener, of a `Host` that is not local (`CompatHost`), and the listener's address.
///
/// Served on the token listener (`TokenAPI` hands these paths over) or on a listener of their own.
public final class CompatAPI<Provider: TokenProviding>: HTTPHandler {
    /// A template a protocol takes its tokens from.
    ///
    /// A class, so that passing it along a request costs one reference count, not one per setting.
    final class Source: Sendable {
        let template: any TemplateProviding<Provider>
        let configuration: ProviderConfiguration

        init(template: any TemplateProviding<Provider>, configuration: ProviderConfiguration) {
            self.template = template
            self.configuration = configuration
        }
    }

    let gce: GCE?
    let azure: Azure?
    let maxWait: Duration
    let metrics: BrokerMetrics
    /// Refuse a `Host` that names neither loopback nor a metadata server (`CompatHost`): the
    /// listener is on a loopback address, which a web page can reach through DNS rebinding.
    let checksHost: Bool
    /// The one protocol served, when only one is: its shape for the answers no route gives.
    private let onlyProtocol: CompatProtocol?
    private let otherCounter: RequestCounter

    /// - Parameters:
    ///   - gce, azure: the protocols to serve; nil: not served.
    ///   - identityHeader: App Service's secret, read from `identityHeaderFile`; nil: `/msi/token` is not served.
    ///   - templates: the templates, among which those the protocols name (the configuration checked they exist).
    ///   - listener: the listener the routes are served on, for the request counters' label.
    ///   - checksHost: the listener is on a loopback address: refuse a `Host` that is not local.
    public init(
        gce: GCEConfiguration?, azure: AzureConfiguration?, identityHeader: [UInt8]?,
        templates: [any TemplateProviding<Provider>], maxWait: Duration, listener: String, checksHost: Bool = true,
        metrics: BrokerMetrics
    ) {
        func source(_ name: String) -> Source {
            guard let template = templates.first(where: { $0.name == name }) else {
                preconditionFailure("the configuration names template \(name), which was not made")
            }
            return Source(template: template, configuration: template.configuration)
        }
        self.gce = gce.map { settings in
            GCE(
                settings, tokens: source(settings.provider), identities: settings.identityProvider.map(source),
                listener: listener, metrics: metrics)
        }
        self.azure = azure.map { settings in
            Azure(
                settings, identities: settings.identities.map { ($0, source($0.provider)) },
                identityHeader: identityHeader, listener: listener, metrics: metrics)
        }
        self.maxWait = maxWait
        self.metrics = metrics
        self.checksHost = checksHost
        onlyProtocol = gce == nil ? (azure == nil ? nil : .azure) : (azure == nil ? .gce : nil)
        otherCounter = metrics.counter(listener: listener, route: "other")
    }

    /// Whether `path` is one of the protocols'.
    public func serves(_ path: String) -> Bool { protocolFor(path) != nil }

    /// False when `path` cannot be one of the protocols' paths, told from two bytes: each is `/`
    /// or begins with `/c` (`/computeMetadata/…`) or `/m` (`/msi/token`, `/metadata/…`). No text
    /// that `String`'s `==` holds equal to one of them begins otherwise: no other character is
    /// canonically equivalent to `/`, `c` or `m`. `serves` still decides.
    @inline(__always)
    public static func mayServe(_ path: String) -> Bool {
        let bytes = path.utf8
        guard bytes.count > 1 else { return bytes.first == UInt8(ascii: "/") }
        let second = bytes[bytes.index(after: bytes.startIndex)]
        return second == UInt8(ascii: "c") || second == UInt8(ascii: "m")
    }

    /// The answer when the request's path is one of the protocols'; nil when it is not (for the
    /// token listener, which hands these paths over and answers the others).
    @_specialize(where Provider == TokenProvider<ContinuousClock>)
    public func answer(_ request: HTTPRequest) -> HTTPReply? {
        switch protocolFor(request.path) {
        case .gce?: handleGCE(request)
        case .azure?: handleAzure(request)
        case nil: nil
        }
    }

    private func protocolFor(_ path: String) -> CompatProtocol? {
        if let gce, gce.serves(path) { return .gce }
        if let azure, azure.serves(path) { return .azure }
        return nil
    }

    @_specialize(where Provider == TokenProvider<ContinuousClock>)
    public func handle(_ request: HTTPRequest) -> HTTPReply {
        answer(request) ?? refuse(.notFound(path: request.path), onlyProtocol, otherCounter)
    }

    /// The server's refusals in the one protocol's shape; a wait refused, in its route's protocol's.
    public func refusal(_ reason: ServerRefusal) -> HTTPResponse {
        let answer = ErrorAnswer.refusal(reason)
        var shape = onlyProtocol
        if case .tooManyWaiting(let path, _) = reason { shape = protocolFor(path) ?? shape }
        return shape.map { answer.response(for: $0) } ?? answer.response
    }

    /// The refusal of a request whose `Host` (as `CompatHeaders` found it) is not local, when
    /// the listener checks it; nil: it may pass (a request without one, too).
    func foreignHost(_ headers: CompatHeaders) -> ErrorAnswer? {
        guard checksHost, headers.withValue(.host, { $0.map { !CompatHost.isLocal($0) } ?? false }) else {
            return nil
        }
        return .foreignHost
    }

    // MARK: - The token, as every protocol gets it

    /// How a protocol renders a token: its format's slot in the child's cache, and the answer
    /// for a token with `expiresIn` seconds left.
    struct Rendering: Sendable {
        let format: AnswerFormat
        let protocolName: CompatProtocol
        /// The SDK's margin: it treats a token with less left as expired.
        let margin: Duration
        /// The answer for a token with `expiresIn` seconds left, naming `resource` (Azure's;
        /// empty for Google's). A token without an expiry is said to expire `tokenRefreshDelaySec`
        /// after its issue, by which time the broker has replaced it (`Answering.answerWithoutExpiry`).
        let render: @Sendable (CachedToken<Provider.Instant>, _ expiresIn: Int, _ resource: String) -> HTTPResponse
    }

    /// The answer with the token of `found`, the child of `source` for the request's checked
    /// values: at once when the child holds one the SDK will not treat as expired; else after the
    /// child's first fetch (a new child) or the fetch its read restarted (a child paused while
    /// idle, whose token expired), waited for at most `maxWait`, or after one forced
    /// refresh (a token inside the SDK's margin, when a fresher one can be had: once per token
    /// version, in the child's window of early refreshes, which callers forcing refreshes do not
    /// use up; waited for at most `marginWait`, then the token held is served). Refused: no
    /// child (no room for another, or the template stopped), no valid token.
    /// - Parameter resource: what the answer names as its resource (Azure's); the same for every
    ///   request that reaches the same child, since the child's values are made from it.
    func token(
        from source: Source, child found: Result<LeasedChild<Provider>, ChildRefusal>, rendering: Rendering,
        resource: String = "", counter: RequestCounter
    ) -> HTTPReply {
        let child: Provider
        let cache: TokenResponseCache<Provider.Instant>
        switch found {
        case .success(let leased): (child, cache) = (leased.child, leased.cache)
        case .failure(.full(let limit, let retryAfter)):
            return refuse(
                .tooManyChildren(provider: source.configuration.name, limit: limit, retryAfter: retryAfter),
                rendering.protocolName, counter)
        case .failure(.stopped):
            return refuse(.shuttingDown, rendering.protocolName, counter)
        }
        let answering = Answering(
            cache: cache, rendering: rendering, resource: resource, source: source, metrics: metrics)
        switch child.read() {
        case .token(let token, let stale, let secondsLeft):
            // Once per version: an issuer that hands the same token back is not asked again and again.
            guard !stale, Self.insideMargin(token, secondsLeft: secondsLeft, margin: rendering.margin),
                cache.claimMarginRefresh(of: token.version)
            else {
                return record(counter, answering.answer(token, stale: stale, secondsLeft: secondsLeft, child: child))
            }
            switch child.refreshEarly(replacing: token.version) {
            case .current(let newer):
                return record(
                    counter,
                    answering.answer(newer, stale: false, secondsLeft: newer.secondsLeft(at: child.now), child: child))
            case .excessive:
                return record(counter, answering.answer(token, stale: stale, secondsLeft: secondsLeft, child: child))
            case .refreshing(let after):
                return wait(
                    child, after: after ?? token.version, timeout: min(maxWait, Self.marginWait), onDemand: false,
                    answering, counter)
            }
        case .unavailable(let wasPaused, let awaitingFirstToken):
            // A first token that comes just after the read completes the waiter at once. A child
            // paused while idle, whose token expired meanwhile, was resumed by this read, which
            // started its fetch: the request waits for that token as for a first one, since the
            // SDKs cannot wait at `/token/ready` and would only retry with backoff.
            if awaitingFirstToken || wasPaused {
                return wait(child, after: nil, timeout: maxWait, onDemand: false, answering, counter)
            }
            let status = child.status()
            return refuse(
                .tokenUnavailable(
                    provider: source.configuration.name, lastError: status.lastError,
                    paused: wasPaused || status.phase == .paused, retryAfter: status.heldOffFor),
                rendering.protocolName, counter)
        case .onDemand:
            return wait(child, after: nil, timeout: maxWait, onDemand: true, answering, counter)
        }
    }

    /// The longest a request waits for a margin refresh before it is answered with the token
    /// held (still valid): below google-auth's 3 s timeout for metadata requests, so that a slow
    /// or failing issuer does not hold the SDK until it gives up.
    static var marginWait: Duration { .seconds(2) }

    /// How one request's token becomes its answer: from the child's cache, in the protocol's format.
    struct Answering: Sendable {
        let cache: TokenResponseCache<Provider.Instant>
        let rendering: Rendering
        let resource: String
        let source: Source
        let metrics: BrokerMetrics

        /// The answer for `token` with `secondsLeft` (nil: no expiry), counting it when stale.
        func answer(_ token: CachedToken<Provider.Instant>, stale: Bool, secondsLeft: Int?, child: Provider)
            -> HTTPResponse
        {
            if stale { metrics.recordStaleServed(provider: source.configuration.name) }
            guard let secondsLeft else { return answerWithoutExpiry(token, stale: stale, child: child) }
            return cache.response(for: token, stale: stale, secondsLeft: secondsLeft, format: rendering.format) {
                rendering.render(token, secondsLeft, resource)
            }
        }

        /// The answer for a token without an expiry: said to expire `tokenRefreshDelaySec` after
        /// its issue, when the broker replaces it (`Rendering.render` counts from the issue date).
        ///
        /// Past that point (a child paused while idle stops refreshing) it is said to expire 1 s
        /// from now, so that it never reads as expired: shown as issued that much later, for
        /// `expires_on` to say what `expires_in` says. That answer moves with the clock, so it is
        /// made for this request, not kept.
        private func answerWithoutExpiry(_ token: CachedToken<Provider.Instant>, stale: Bool, child: Provider)
            -> HTTPResponse
        {
            let delay = Duration.seconds(source.configuration.tokenRefreshDelaySec)
            let age = token.issuedAt.duration(to: child.now)
            guard age >= delay else {
                let secondsLeft = (delay - age).secondsLeft
                return cache.response(for: token, stale: stale, secondsLeft: secondsLeft, format: rendering.format) {
                    rendering.render(token, secondsLeft, resource)
                }
            }
            var shown = token
            shown.issuedAtDate = token.issuedAtDate.addingTimeInterval((age - delay).inSeconds + 1)
            return rendering.render(shown, 1, resource)
        }
    }

    /// Whether the SDK would treat `token` as expired although a fresher one could be had: it
    /// has no more than the margin left, and a new token would have more (its lifetime is longer).
    ///
    /// `secondsLeft` is rounded up (`CachedToken.secondsLeft(at:)`): a token showing exactly the
    /// margin has less than it left, which google-auth (at most 225 s left) and msal (under
    /// 300 s) both treat as expired; hence `<=`.
    static func insideMargin(_ token: CachedToken<Provider.Instant>, secondsLeft: Int?, margin: Duration) -> Bool {
        guard let secondsLeft, let lifetime = token.token.lifetime else { return false }
        return .seconds(secondsLeft) <= margin && lifetime > margin
    }

    /// Suspends the request until the child has a token newer than `after` (any, for nil), or
    /// `maxWait` has passed; answers with the newest valid token then, else 503.
    private func wait(
        _ child: Provider, after: UInt64?, timeout: Duration, onDemand: Bool, _ answering: Answering,
        _ counter: RequestCounter
    ) -> HTTPReply {
        let rendering = answering.rendering
        let deadline = child.deadline(in: timeout)
        return .deferred { responder in
            let id = child.addWaiter(after: after, deadline: deadline, onDemand: onDemand, forRefresh: after != nil) {
                outcome in
                let now = child.now
                let response: HTTPResponse
                switch outcome {
                case .token(let token, let stale):
                    response = answering.answer(
                        token, stale: stale, secondsLeft: token.secondsLeft(at: now), child: child)
                case .exhausted(let token?, _):
                    response = answering.answer(
                        token, stale: true, secondsLeft: token.secondsLeft(at: now), child: child)
                case .timedOut(let token?, _):
                    response = answering.answer(
                        token, stale: child.status().stale, secondsLeft: token.secondsLeft(at: now), child: child)
                case .exhausted(nil, _), .timedOut(nil, _), .cancelled:
                    let status = child.status()
                    response = ErrorAnswer.tokenUnavailable(
                        provider: child.name, lastError: status.lastError, paused: status.phase == .paused,
                        retryAfter: status.heldOffFor
                    ).response(for: rendering.protocolName)
                case .shuttingDown:
                    response = ErrorAnswer.shuttingDown.response(for: rendering.protocolName)
                }
                counter.record(status: response.status)
                responder.respond(response)
            }
            responder.onClose { child.removeWaiter(id) }
        }
    }

    // MARK: - Shared helpers

    /// Counts an immediate answer under its route.
    func record(_ counter: RequestCounter, _ response: HTTPResponse) -> HTTPReply {
        counter.record(status: response.status)
        return .response(response)
    }

    /// Counts and sends an error in the protocol's shape (the broker's own, for nil).
    func refuse(_ error: ErrorAnswer, _ protocolName: CompatProtocol?, _ counter: RequestCounter) -> HTTPReply {
        record(counter, protocolName.map { error.response(for: $0) } ?? error.response)
    }
}

/// The request headers the compatibility routes read, found in one pass over the headers rather
/// than one look-up each (a request reads three or four of them): each `Field` is the first
/// header of its name, names compared without regard to ASCII case, as `HTTPRequest.header(_:)`
/// finds it.
///
/// The pass compares the names in place and keeps positions in the request's headers, not the
/// values: the routes read the values in place too (`withValue`), and make no strings of them.
struct CompatHeaders {
    private let headers: HTTPFields
    /// For each `Field`, by its raw value, the position of the first header of its name; -1: none.
    private var positions = SIMD8<Int>(repeating: -1)

    enum Field: Int {
        case forwardedFor, forwarded, host, metadataFlavor, metadata, identityHeader
    }

    /// Whether the request has a header `field`.
    func has(_ field: Field) -> Bool { positions[field.rawValue] >= 0 }

    /// Whether the request says it was relayed: `X-Forwarded-For`, or RFC 7239's `Forwarded`
    /// (a proxy that writes the standard header relays as surely as one that writes the other),
    /// with any value. The metadata services refuse such requests, and so do these routes.
    var isRelayed: Bool { has(.forwardedFor) || has(.forwarded) }

    /// Calls `body` with the bytes of the value of the header `field`, read in place; nil when
    /// the request has none.
    func withValue<Result>(_ field: Field, _ body: (UnsafeBufferPointer<UInt8>?) -> Result) -> Result {
        let position = positions[field.rawValue]
        return position < 0 ? body(nil) : headers.withValue(at: position, body)
    }

    /// Whether the value of the header `field` is `lowercase` (ASCII) without regard to ASCII case.
    func value(_ field: Field, equalsIgnoringCase lowercase: StaticString) -> Bool {
        withValue(field) { $0.map { Self.matches($0, lowercase) } ?? false }
    }

    private init(_ headers: HTTPFields) { self.headers = headers }

    /// The headers of `request`. A function rather than an initializer: an initializer takes its
    /// argument owned, which retains the request's fields (path, method, headers, query, body) at
    /// every call.
    static func read(_ request: HTTPRequest) -> CompatHeaders {
        var found = CompatHeaders(request.headers)
        request.headers.forEachName { index, name in
            if let field = field(name), found.positions[field.rawValue] < 0 {
                found.positions[field.rawValue] = index
            }
            return true
        }
        return found
    }

    /// Which of the names `name` is, without regard to ASCII case (as `equalsIgnoringASCIICase`):
    /// told by its length, then its bytes. Most headers are none, by length alone.
    private static func field(_ name: UnsafeBufferPointer<UInt8>) -> Field? {
        switch name.count {
        case 4: matches(name, "host") ? .host : nil
        case 8: matches(name, "metadata") ? .metadata : nil
        case 9: matches(name, "forwarded") ? .forwarded : nil
        case 15:
            matches(name, "x-forwarded-for") ? .forwardedFor : matches(name, "metadata-flavor") ? .metadataFlavor : nil
        case 17: matches(name, "x-identity-header") ? .identityHeader : nil
        default: nil
        }
    }

    /// Whether `name` is `lowercase` (ASCII, in lowercase, of `name`'s length) without regard to
    /// ASCII case; a `StaticString`'s bytes are constant data, read without an array.
    private static func matches(_ name: UnsafeBufferPointer<UInt8>, _ lowercase: StaticString) -> Bool {
        let known = UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount)
        guard known.count == name.count else { return false }
        for index in name.indices where name[index].asciiLowercased != known[index] { return false }
        return true
    }
}

/// Whether the text whose UTF-8 is `bytes` (nil: none) is `expected` by `String`'s `==` (by
/// canonical equivalence), answered from the bytes when they are the same, which is the common
/// case and costs a fraction of `==`; a string is made of them, for `==`, only when they differ.
func sameText(utf8 bytes: UnsafeBufferPointer<UInt8>?, _ expected: String) -> Bool {
    guard let bytes else { return false }
    let exactly = expected.withUTF8Bytes {
        $0.count == bytes.count && (bytes.isEmpty || memcmp($0.baseAddress!, bytes.baseAddress!, bytes.count) == 0)
    }
    return exactly || String(decoding: bytes, as: UTF8.self) == expected
}

/// Which `Host` a compatibility route on a loopback listener accepts: this machine's loopback
/// (`localhost`, 127.0.0.0/8, `[::1]`) and the names SDKs give metadata servers
/// (`metadata.google.internal`, `metadata`, `169.254.169.254`), with any port. A web page that
/// rebinds its own name to 127.0.0.1 sends its own name, and is refused.
enum CompatHost {
    /// The names, besides 127.0.0.0/8 and `[::1]`, in lowercase.
    private static let names: [[UInt8]] = ["localhost", "metadata.google.internal", "metadata", "169.254.169.254"]
        .map { Array($0.utf8) }

    /// Whether the `Host` value whose bytes are `bytes` is local, read in place, byte by byte:
    /// every request on such a listener comes through here.
    static func isLocal(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        if bytes.first == UInt8(ascii: "[") {
            // `[::1]`, with or without a port.
            let literal = "[::1]".utf8
            guard bytes.starts(with: literal) else { return false }
            return bytes.count == literal.count
                || (bytes[literal.count] == UInt8(ascii: ":") && isPort(bytes, from: literal.count + 1))
        }
        var end = bytes.count
        if let colon = bytes.lastIndex(of: UInt8(ascii: ":")) {
            guard isPort(bytes, from: colon + 1) else { return false }
            end = colon
        }
        let name = UnsafeBufferPointer(rebasing: bytes[..<end])
        // The usual `Host` is a loopback address: it is tried first (the order does not change
        // the answer). A name is compared only when the lengths are the same.
        if isLoopbackIPv4(name) { return true }
        for known in names where known.count == name.count {
            if zip(name, known).allSatisfy({ $0.asciiLowercased == $1 }) { return true }
        }
        return false
    }

    /// 127.0.0.0/8 in dotted decimal: four parts of 1–3 digits, each at most 255, the first 127.
    private static func isLoopbackIPv4(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        guard name.count >= 4, name[0] == UInt8(ascii: "1"), name[1] == UInt8(ascii: "2"),
            name[2] == UInt8(ascii: "7"), name[3] == UInt8(ascii: ".")
        else { return false }
        var parts = 0
        var value = 0
        var digits = 0
        for byte in name {
            if byte == UInt8(ascii: ".") {
                guard digits > 0 else { return false }
                parts += 1
                (value, digits) = (0, 0)
            } else if byte >= 0x30, byte <= 0x39, digits < 3 {
                value = value * 10 + Int(byte - 0x30)
                digits += 1
                guard value <= 255 else { return false }
            } else {
                return false
            }
        }
        return digits > 0 && parts == 3
    }

    /// Whether `bytes` from `start` to the end are a port: 1–5 digits.
    private static func isPort(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Bool {
        let count = bytes.count - start
        guard count >= 1, count <= 5 else { return false }
        for index in start..<bytes.count where bytes[index] < 0x30 || bytes[index] > 0x39 { return false }
        return true
    }

}
