import TokenBrokerAPI
import TokenBrokerCore
import TokenBrokerServer
import TokenBrokerSources

/// The cloud SDKs' protocols (`compat`): the steps `Broker.run` takes for them.
///
/// In `run`: `readIdentityHeader` with the other secret files (a problem exits 2), and
/// `compatWarnings` and `templateWarnings` logged (again at each reload); `compatHandlers` when
/// the routes are made (at start and at each reload): the routes served on the token listener,
/// and those of each protocol with a `listen` address, which `openListeners` gives a listener of
/// its own. `--check-config` reads the header file and prints the same warnings.
extension Broker {
    /// A protocol's routes for a listener of its own: its name, address and routes.
    typealias OwnCompatRoutes = (name: String, address: ListenAddress, handler: CompatAPI<Provider>)

    /// A protocol's own listener.
    struct CompatListener {
        let name: String
        let address: ListenAddress
        let server: HTTPServer
    }

    /// App Service's secret from `compat.azure.identityHeaderFile`, read once; nil when none is configured.
    ///
    /// The secret must be visible ASCII (0x21–0x7E) throughout, as a client can send it: HTTP
    /// strips surrounding blanks (and azure-identity refuses to send them), Python sends a header
    /// as Latin-1, and the broker refuses control characters in headers. The error does not
    /// quote the secret. It must have at least `minimumIdentityHeaderBytes`.
    static func readIdentityHeader(_ configuration: BrokerConfiguration) throws(ConfigurationError) -> [UInt8]? {
        guard let path = configuration.compat.azure?.identityHeaderFile else { return nil }
        let secret: [UInt8]
        do {
            secret = Array(try SecretFile.readLine(path).utf8)
        } catch {
            throw ConfigurationError(key: "compat.azure.identityHeaderFile", error.detail)
        }
        guard secret.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw ConfigurationError(
                key: "compat.azure.identityHeaderFile",
                "\(path) must hold visible ASCII characters only (0x21–0x7E: no spaces, tabs, control"
                    + " characters or characters beyond ASCII), which is what a client can send as X-IDENTITY-HEADER")
        }
        guard secret.count >= minimumIdentityHeaderBytes else {
            throw ConfigurationError(
                key: "compat.azure.identityHeaderFile",
                "the secret in \(path) is too short (\(secret.count) of at least \(minimumIdentityHeaderBytes) bytes),"
                    + " so that it cannot be guessed: use one such as the 32 hex digits of `openssl rand -hex 16`")
        }
        return secret
    }

    /// The shortest App Service secret accepted: a local process may try secrets as fast as the
    /// broker answers, so a short one would be found (Azure's own is a GUID, 36 characters).
    static let minimumIdentityHeaderBytes = 16

    /// What to warn about: the protocols served on the token listener while callers have keys
    /// (the SDKs cannot send one, so these routes bypass them), a protocol's own listener that
    /// other machines can reach (for the same reason), IMDS served beside App Service's
    /// secret (`imds: true` with `identityHeaderFile`: the same tokens without the secret), and
    /// `lifetimeWarnings`.
    static func compatWarnings(_ configuration: BrokerConfiguration) -> [String] {
        let compat = configuration.compat
        let shared = [("gce", compat.gce?.listen), ("azure", compat.azure?.listen)].filter { name, listen in
            listen == nil && (name == "gce" ? compat.gce != nil : compat.azure != nil)
        }
        var warnings: [String] = []
        if configuration.clientKeysFile != nil, !shared.isEmpty {
            warnings.append(
                "compat." + shared.map(\.0).joined(separator: " and compat.")
                    + " served on the token listener, where the caller keys (clientKeysFile) do not apply to"
                    + " their routes: any client of the listener can read their templates' tokens; give each a"
                    + " listen address of its own")
        }
        for (name, listen) in [("gce", compat.gce?.listen), ("azure", compat.azure?.listen)] {
            if let listen, !listen.isLoopback {
                warnings.append(
                    "compat.\(name) listens on \(listen), which other machines can reach, and the caller keys"
                        + " (clientKeysFile) never apply to its routes: any client there can read its templates'"
                        + " tokens; listen on loopback or a Unix socket unless that is meant")
            }
        }
        if let azure = compat.azure, azure.identityHeaderFile != nil, azure.servesIMDS {
            warnings.append(
                "compat.azure.imds is true beside an identityHeaderFile: IMDS's route, which has no secret,"
                    + " serves the same identities' tokens as App Service's to any client of the listener"
                    + " without the secret; set imds to false unless that is meant")
        }
        return warnings + lifetimeWarnings(configuration)
    }

    /// Each template a protocol serves whose tokens the SDK could get inside its margin (it
    /// treats a token with less than 3 min 45 s left as expired: google-auth; 5 min: msal).
    ///
    /// A served token has at least its lifetime minus the refresh point left, the latest point
    /// `RefreshSchedule` can pick for it (at most `tokenRefreshDelaySec`, 85 % of the lifetime,
    /// and the lifetime less a margin of a tenth of it, at most 30 s). Only the local signer's lifetime is
    /// known before its first token; an issuer's is not, and is not reported here.
    ///
    /// A template whose source sets no lifetime (a `file` without `lifetimeSec`, an `http`
    /// source without `expiresInPointer`, `expiresAtPointer` or `defaultLifetimeSec`) may get
    /// tokens without expiry, which the protocols advertise as expiring `tokenRefreshDelaySec`
    /// after their issue (`CompatAPI.Answering.answerWithoutExpiry`): at or under the SDK's margin, the
    /// SDK treats each as expired at once and asks again at every use; that is reported too.
    static func lifetimeWarnings(_ configuration: BrokerConfiguration) -> [String] {
        // google-auth treats a token with 225 s left as expired (`atMargin`); msal one with less than 300.
        var served: [(provider: String, sdk: String, margin: Int, atMargin: Bool)] = []
        if let gce = configuration.compat.gce {
            served.append((gce.provider, "google-auth", 225, true))
            if let identity = gce.identityProvider { served.append((identity, "google-auth", 225, true)) }
        }
        for identity in configuration.compat.azure?.identities ?? [] {
            served.append((identity.provider, "msal", 300, false))
        }
        var warnings: [String] = []
        var seen: Set<String> = []
        for (name, sdk, margin, atMargin) in served where seen.insert(name + sdk).inserted {
            guard let provider = configuration.providers.first(where: { $0.name == name }) else { continue }
            let signer: JWTSourceConfiguration
            switch provider.source {
            case .jwt(let settings): signer = settings
            case let source where Self.mayHaveNoExpiry(source):
                let delay = provider.tokenRefreshDelaySec
                if delay <= margin {
                    warnings.append(
                        "provider \"\(name)\": its source sets no token lifetime, so a token it fetches without"
                            + " expiry (one that is not a JWT with exp) is advertised as expiring"
                            + " tokenRefreshDelaySec (\(delay) s) after its issue, no more than"
                            + " the \(margin) s before expiry at which \(sdk) treats a token as expired: it asks again"
                            + " at every use. Set the source's lifetime, or tokenRefreshDelaySec well above \(margin)")
                }
                continue
            default: continue
            }
            let lifetime = signer.lifetimeSec
            // The latest refresh point the schedule can pick: the top of its jittered band.
            let refreshAt = RefreshSchedule(refreshDelay: .seconds(provider.tokenRefreshDelaySec))
                .refreshAfter(lifetime: .seconds(lifetime), unit: 1)
            let leastLeft =
                Int(rounding: (Duration.seconds(lifetime) - refreshAt) / .seconds(1), .toNearestOrAwayFromZero) ?? 0
            guard leastLeft < margin || (atMargin && leastLeft == margin) else { continue }
            if lifetime <= margin {
                warnings.append(
                    "provider \"\(name)\": its tokens live \(lifetime) s, no more than the \(margin) s before expiry at"
                        + " which \(sdk) treats a token as expired, so it asks again for every call; allowed: a"
                        + " lifetimeSec above \(margin)")
            } else {
                warnings.append(
                    "provider \"\(name)\": its tokens may be served with \(leastLeft) s left, \(atMargin ? "no more" : "less") than the"
                        + " \(margin) s \(sdk) needs; such a request forces a refresh and waits for it. Set"
                        + " tokenRefreshDelaySec to at most \(lifetime - margin - (atMargin ? 1 : 0)) to refresh in time"
                )
            }
        }
        return warnings
    }

    /// Whether `source` sets no lifetime for a token that carries none (not a JWT with `exp`).
    private static func mayHaveNoExpiry(_ source: SourceConfiguration) -> Bool {
        switch source {
        case .file(let settings): settings.lifetimeSec == nil
        case .http(let settings):
            settings.expiresInPointer == nil && settings.expiresAtPointer == nil && settings.defaultLifetimeSec == nil
        case .jwt, .oauth2: false
        }
    }

    /// Each template that callers without a secret can fill: on the routes that reach it without
    /// one, its allow-lists admit more combinations of values than its `maxChildren`.
    ///
    /// Those routes cannot tell callers apart, so one local client can make `maxChildren`
    /// children of its choosing (once each, without reading them again), and every other caller
    /// asking for a combination not made yet then gets 503 `too_many_children` until the earliest
    /// of them is dropped, `childIdleSec` later. The defence is narrow allow-lists (exact values,
    /// few enough combinations) or a larger `maxChildren`. A caller key or App Service's secret
    /// is trusted: the templates reached only with one are not reported. See `reachWithoutSecret`.
    static func templateWarnings(_ configuration: BrokerConfiguration) -> [String] {
        var warnings: [String] = []
        for provider in configuration.providers where provider.isTemplate {
            let open = reachWithoutSecret(provider, configuration)
            guard !open.routes.isEmpty, open.combinations.exceeds(provider.maxChildren) else { continue }
            let prefixes =
                open.prefixLists.isEmpty
                ? "" : " (a prefix entry, ending in *, in " + open.prefixLists.sorted().joined(separator: " and ") + ")"
            let limit = provider.maxChildren
            let routes =
                open.routes.dropLast().joined(separator: ", ") + (open.routes.count > 1 ? " and " : "")
                + open.routes[open.routes.count - 1]
            let sets = provider.perRequest.contains(.scope) ? " (n scope tokens make 2^n − 1 scope sets)" : ""
            let keys =
                open.routes.count == 1 && configuration.clientKeysFile == nil
                ? ", or give callers keys (clientKeysFile)" : ""
            warnings.append(
                "template \"\(provider.name)\": its allow-lists admit \(open.combinations) combinations of values"
                    + "\(prefixes), more than its maxChildren (\(limit)), on routes that take no secret: \(routes)."
                    + " Any client there can fill it with \(limit) of its choosing, and every other caller asking for"
                    + " a new combination then gets 503 too_many_children for up to childIdleSec"
                    + " (\(provider.childIdleSec) s). Allow exact values only, few enough combinations to fit\(sets),"
                    + " or raise maxChildren\(keys)")
        }
        return warnings
    }

    /// The routes that reach `provider`'s children without a secret (empty: none does), and how
    /// many children they can make between them.
    ///
    /// - Without `clientKeysFile`, the token listener's routes: any combination
    ///   `TokenRequestValues.checked` accepts, each parameter of `perRequest` named with an
    ///   admitted value or left out (the template's default for it, a child of its own) unless its
    ///   source needs it (`requiredParameters`). They can make every child the protocols can.
    /// - `compat.gce`'s token route (its `provider`): a scope set each; its identity route
    ///   (`identityProvider`): an audience each.
    /// - `compat.azure`'s IMDS route, when served (an identity's `provider`): a resource each, or
    ///   for a template without `resource` the one scope `R/.default`, which an exact entry
    ///   admits when it ends so (every such scope set is one of `compat.gce`'s too).
    ///
    /// These routes' children differ in the parameters they leave out, so their counts add up.
    static func reachWithoutSecret(_ provider: ProviderConfiguration, _ configuration: BrokerConfiguration) -> (
        routes: [String], combinations: Combinations, prefixLists: Set<String>
    ) {
        var prefixLists: Set<String> = []
        /// What `parameter`'s allow-list admits (named, never empty), noting a prefix entry.
        func admitted(_ parameter: RequestParameter) -> Combinations {
            let (list, name) =
                switch parameter {
                case .audience: (provider.allowedAudiences, "allowedAudiences")
                case .scope: (provider.allowedScopes, "allowedScopes")
                case .resource: (provider.allowedResources, "allowedResources")
                }
            if list.contains(where: \.isPrefix) { prefixLists.insert(name) }
            return parameter == .scope ? .scopeSets(list) : .values(list)
        }
        let name = provider.name
        let gce = configuration.compat.gce
        let azure = configuration.compat.azure.flatMap { $0.servesIMDS ? $0 : nil }
        let scopeSets = gce?.provider == name
        let audiences = gce?.identityProvider == name
        let azureServed = azure?.identities.contains { $0.provider == name } == true
        var routes: [String] = []
        var combinations = Combinations.count(0)
        if configuration.clientKeysFile == nil {
            let defaults = !provider.perRequest.isSubset(of: provider.requiredParameters)
            routes.append(
                "the token listener's routes (no clientKeysFile"
                    + (defaults ? "; a request there may also leave a parameter out, for the template's default)" : ")")
            )
            combinations = provider.perRequest.reduce(.count(1)) { product, parameter in
                product * (admitted(parameter) + .count(provider.requiredParameters.contains(parameter) ? 0 : 1))
            }
        }
        if scopeSets { routes.append("compat.gce's token route") }
        if audiences { routes.append("compat.gce's identity route") }
        if azureServed { routes.append("compat.azure's IMDS route") }
        // The token listener's children include the protocols'.
        guard configuration.clientKeysFile != nil else { return (routes, combinations, prefixLists) }
        if scopeSets { combinations = combinations + admitted(.scope) }
        if audiences { combinations = combinations + admitted(.audience) }
        if azureServed, provider.perRequest.contains(.resource) {
            combinations = combinations + admitted(.resource)
        } else if azureServed, !scopeSets {
            // One scope `R/.default` each: unboundedly many after a prefix, else the exact entries ending so.
            let scopes = provider.allowedScopes.filter { $0.isPrefix || $0.text.hasSuffix("/.default") }
            if scopes.contains(where: \.isPrefix) { prefixLists.insert("allowedScopes") }
            combinations = combinations + .values(scopes)
        }
        return (routes, combinations, prefixLists)
    }

    /// A number of combinations of values, counted without overflow: past `Int.max` it stays
    /// there (so that `Int.max` reads "at least"), and an allow-list with a prefix entry admits
    /// `unbounded`ly many.
    enum Combinations: Equatable, CustomStringConvertible {
        case count(Int)
        case unbounded

        /// The values an allow-list admits: unboundedly many with a prefix entry, else its exact
        /// entries, each once.
        static func values(_ list: [AllowPattern]) -> Self {
            list.contains(where: \.isPrefix) ? .unbounded : .count(Set(list.map(\.text)).count)
        }

        /// The scope sets `allowedScopes` admits: 2^n − 1 of n exact scope tokens, every set but the
        /// empty one (an empty scope is refused), each once whatever its order and repeats (a
        /// child's scopes are sorted and without repeats).
        static func scopeSets(_ list: [AllowPattern]) -> Self {
            guard case .count(let tokens) = values(list) else { return .unbounded }
            // 2^63 − 1 is Int.max: from 63 tokens on, the count is Int.max (exact at 63, saturated past it).
            return .count(tokens >= Int.bitWidth - 1 ? .max : (1 << tokens) - 1)
        }

        /// Each combination of one of `lhs`'s with one of `rhs`'s.
        static func * (lhs: Self, rhs: Self) -> Self {
            switch (lhs, rhs) {
            case (.count(0), _), (_, .count(0)): return .count(0)
            case (.unbounded, _), (_, .unbounded): return .unbounded
            case (.count(let left), .count(let right)):
                let (product, overflow) = left.multipliedReportingOverflow(by: right)
                return .count(overflow ? .max : product)
            }
        }

        /// The combinations of `lhs` and those of `rhs`, which share none.
        static func + (lhs: Self, rhs: Self) -> Self {
            guard case .count(let left) = lhs, case .count(let right) = rhs else { return .unbounded }
            let (sum, overflow) = left.addingReportingOverflow(right)
            return .count(overflow ? .max : sum)
        }

        /// Whether more than `limit`.
        func exceeds(_ limit: Int) -> Bool {
            guard case .count(let count) = self else { return true }
            return count > limit
        }

        var description: String {
            switch self {
            case .unbounded: "unboundedly many"
            case .count(.max): "at least \(Int.max)"
            case .count(let count): "\(count)"
            }
        }
    }

    /// The protocols' routes for the token listener (nil when none is served there), and the
    /// routes of each protocol with a `listen` address of its own, with its name and address.
    static func compatHandlers(
        _ configuration: BrokerConfiguration, templates: [Template], identityHeader: [UInt8]?,
        metrics: BrokerMetrics
    ) -> (onTokenListener: CompatAPI<Provider>?, own: [OwnCompatRoutes]) {
        let compat = configuration.compat
        let maxWait = Duration.seconds(configuration.maxWaitSec)
        let served = templates.map { $0 as any TemplateProviding<Provider> }
        // A loopback address (not a Unix socket) is what a web page reaches through DNS rebinding.
        func routes(gce: GCEConfiguration?, azure: AzureConfiguration?, listener: String, address: ListenAddress)
            -> CompatAPI<Provider>?
        {
            guard gce != nil || azure != nil else { return nil }
            return CompatAPI(
                gce: gce, azure: azure, identityHeader: identityHeader, templates: served, maxWait: maxWait,
                listener: listener, checksHost: address.isLoopback && address.unixPath == nil, metrics: metrics)
        }
        let shared = routes(
            gce: compat.gce?.listen == nil ? compat.gce : nil, azure: compat.azure?.listen == nil ? compat.azure : nil,
            listener: "token", address: configuration.listen)
        var own: [OwnCompatRoutes] = []
        if let gce = compat.gce, let address = gce.listen,
            let handler = routes(gce: gce, azure: nil, listener: "gce", address: address)
        {
            own.append(("gce", address, handler))
        }
        if let azure = compat.azure, let address = azure.listen,
            let handler = routes(gce: nil, azure: azure, listener: "azure", address: address)
        {
            own.append(("azure", address, handler))
        }
        return (shared, own)
    }
}
