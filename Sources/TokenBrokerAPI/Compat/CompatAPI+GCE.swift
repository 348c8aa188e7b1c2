import TokenBrokerCore
import TokenBrokerServer

/// Google's metadata server, as google-auth and the other Google SDKs ask it when
/// `GCE_METADATA_HOST` (and, for Python, `GCE_METADATA_IP`) point at the broker:
///
/// | path (under `/computeMetadata/v1`) | answer |
/// |---|---|
/// | `/` (not under it) | 200 `computeMetadata/`: the SDKs' detection probe |
/// | `/project/project-id`, `/project/numeric-project-id`, `/universe/universe-domain` | text (404 when not configured) |
/// | `/instance/service-accounts/` | the accounts: `default/` and the configured email |
/// | `/instance/service-accounts/{account}/` | `?recursive=true`: JSON `email`, `scopes`, `aliases`; else a listing |
/// | `…/{account}/email`, `…/aliases`, `…/scopes` | text |
/// | `…/{account}/token[?scopes=a,b]` | JSON `access_token`, `expires_in`, `token_type`: the `provider` template's child for those scopes |
/// | `…/{account}/identity?audience=A` | the bare JWT: the `identityProvider` template's child for that audience |
///
/// `{account}` is `default` or the configured email. Every request must carry
/// `Metadata-Flavor: Google` (else 403) and neither `X-Forwarded-For` nor `Forwarded` (403); every answer carries
/// `Metadata-Flavor: Google` and a `Content-Type` (google-auth fails on an answer without one).
extension CompatAPI {
    /// What the metadata server serves: its settings, its answers that never change (built
    /// once), how it renders tokens, and its request counters.
    ///
    /// A class, so that reading it per request costs one reference count, not one per answer it holds.
    final class GCE: Sendable {
        let tokens: Source
        /// The identity tokens' template, when configured, and the values last checked for
        /// `…/identity`'s `audience`, with their child.
        let identities: (source: Source, memo: CheckedValuesMemo<String, Provider>)?
        /// Every path served, found with one look-up per request.
        let routes: [String: Route]
        /// The token routes' paths (`default`'s and the email's), which SDKs ask most: compared
        /// before the look-up, so that their requests do not hash the long path.
        let tokenPaths: [(path: String, route: Route)]
        /// The values last checked for `…/token`'s `scopes`, with their child.
        let scopesMemo: CheckedValuesMemo<String, Provider>
        /// The same for a token request that names no scopes, which asks for the configured
        /// ones: a memo of its own (its one key is the empty text), so that SDKs asking with and
        /// without scopes do not take turns at one memo.
        let defaultScopesMemo: CheckedValuesMemo<String, Provider>
        /// The configured scopes, space-separated (the configuration checked that the template
        /// allows them).
        let defaultScope: String
        let tokenRendering: Rendering
        let identityRendering: Rendering
        let tokenCounter: RequestCounter
        let identityCounter: RequestCounter
        let metadataCounter: RequestCounter

        /// google-auth refreshes a token with less than 3 min 45 s left.
        static var margin: Duration { .seconds(225) }
        static var prefix: String { "/computeMetadata/" }

        /// What a path is.
        enum Route: Sendable {
            /// An answer that never changes.
            case fixed(HTTPResponse)
            /// An account's directory (`…/{account}/`): its listing, and its JSON for `recursive=true`.
            case account(listing: HTTPResponse, recursive: HTTPResponse)
            /// `…/{account}/token`.
            case token
            /// `…/{account}/identity`, when an identity template is configured.
            case identity
        }

        init(
            _ settings: GCEConfiguration, tokens: Source, identities: Source?, listener: String, metrics: BrokerMetrics
        ) {
            self.tokens = tokens
            self.identities = identities.map { ($0, CheckedValuesMemo($0.template)) }
            scopesMemo = CheckedValuesMemo(tokens.template)
            defaultScopesMemo = CheckedValuesMemo(tokens.template)
            defaultScope = settings.scopes.joined(separator: " ")
            let v1 = "/computeMetadata/v1"
            let accountsPath = v1 + "/instance/service-accounts"
            let accountNames = ["default", settings.serviceAccountEmail]
            var fixed: [String: HTTPResponse] = [
                "/": Self.text("computeMetadata/\n"),
                "/computeMetadata/": Self.text("v1/\n"),
                v1 + "/": Self.text("instance/\nproject/\n" + (settings.universeDomain == nil ? "" : "universe/\n")),
                v1 + "/instance": Self.text("service-accounts/\n"),
                v1 + "/instance/": Self.text("service-accounts/\n"),
                v1 + "/project/project-id": Self.text(settings.projectId),
                accountsPath: Self.text(accountNames.map { $0 + "/\n" }.joined()),
                accountsPath + "/": Self.text(accountNames.map { $0 + "/\n" }.joined()),
            ]
            if let number = settings.numericProjectId { fixed[v1 + "/project/numeric-project-id"] = Self.text(number) }
            if let domain = settings.universeDomain { fixed[v1 + "/universe/universe-domain"] = Self.text(domain) }
            var routes = fixed.mapValues { Route.fixed($0) }
            let recursive = JSONText.object([
                ("aliases", "[\"default\"]"), ("email", JSONText.quoted(settings.serviceAccountEmail)),
                ("scopes", "[" + settings.scopes.map(JSONText.quoted).joined(separator: ",") + "]"),
            ])
            for name in accountNames {
                let account = accountsPath + "/" + name
                routes[account + "/"] = .account(
                    listing: Self.text(
                        "aliases\nemail\n" + (identities == nil ? "" : "identity\n") + "scopes\ntoken\n"),
                    recursive: Self.json(recursive))
                routes[account + "/email"] = .fixed(Self.text(settings.serviceAccountEmail))
                routes[account + "/aliases"] = .fixed(Self.text("default"))
                routes[account + "/scopes"] = .fixed(Self.text(settings.scopes.map { $0 + "\n" }.joined()))
                routes[account + "/token"] = .token
                if identities != nil { routes[account + "/identity"] = .identity }
            }
            self.routes = routes
            // In a fixed order, `default`'s token first (what SDKs ask most), so that the number
            // of comparisons does not change with the dictionary's seed from one run to the next.
            tokenPaths = accountNames.flatMap { name in
                ["/token", "/identity"].compactMap { leaf in
                    let path = accountsPath + "/" + name + leaf
                    return routes[path].map { (path, $0) }
                }
            }
            tokenRendering = Rendering(format: .gceToken, protocolName: .gce, margin: Self.margin) {
                token, expiresIn, _ in
                Self.json(
                    JSONText.object([
                        ("access_token", JSONText.quoted(token.token.accessToken)),
                        ("expires_in", String(expiresIn)), ("token_type", "\"Bearer\""),
                    ]))
            }
            identityRendering = Rendering(format: .gceIdentity, protocolName: .gce, margin: Self.margin) {
                token, _, _ in
                Self.text(token.token.accessToken)
            }
            let route = { (path: String) in metrics.counter(listener: listener, route: path) }
            tokenCounter = route(accountsPath + "/{account}/token")
            identityCounter = route(accountsPath + "/{account}/identity")
            metadataCounter = route(v1 + "/{metadata}")
        }

        /// `/`, by its one byte (no other text equals it), or a path under `/computeMetadata/`.
        func serves(_ path: String) -> Bool {
            path.utf8.count == 1 ? path.utf8.first == UInt8(ascii: "/") : path.hasBytePrefix(Self.prefix)
        }

        /// A text answer, with the headers every metadata answer carries.
        static func text(_ text: String) -> HTTPResponse {
            HTTPResponse(
                status: 200, body: Array(text.utf8),
                headers: [
                    ("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
                    CompatProtocol.metadataFlavor,
                ])
        }

        /// A JSON answer, with the headers every metadata answer carries.
        static func json(_ json: String) -> HTTPResponse {
            HTTPResponse(status: 200, json: json, headers: [CompatProtocol.metadataFlavor])
        }
    }

    /// Answers one metadata server request (`serves` said the path is its).
    func handleGCE(_ request: HTTPRequest) -> HTTPReply {
        guard let gce else { preconditionFailure("a metadata path without the metadata server") }
        // A token path is matched byte for byte; any other path, and a token path written in
        // other code points that `String` holds equal, by the look-up, as before.
        let route = gce.tokenPaths.first { $0.path.isExactly(request.path) }?.route ?? gce.routes[request.path]
        let counter: RequestCounter
        switch route {
        case .token?: counter = gce.tokenCounter
        case .identity?: counter = gce.identityCounter
        default: counter = gce.metadataCounter
        }
        if !Methods.read.contains(request.method) {
            return refuse(.methodNotAllowed(method: request.method, allow: Methods.read), .gce, counter)
        }
        let headers = CompatHeaders.read(request)
        if headers.isRelayed { return refuse(.forwardedRequest, .gce, counter) }
        if let refusal = foreignHost(headers) { return refuse(refusal, .gce, counter) }
        guard headers.withValue(.metadataFlavor, { sameText(utf8: $0, "Google") }) else {
            return refuse(.missingMetadataFlavor, .gce, counter)
        }
        do throws(BadRequest) {
            switch route {
            case .fixed(let answer)?:
                return record(counter, answer)
            case .account(let listing, let recursive)?:
                // `true` or `false`, given once: a second value, which one server might read and
                // another not, is refused, as every protocol parameter given twice is.
                let value = try QueryParameters.values(GCEQuery.account, request)[0]
                if let value, value != "true", value != "false" {
                    throw BadRequest(.invalidParameter("recursive", allowed: "true or false"))
                }
                return record(counter, value == "true" ? recursive : listing)
            case .token?:
                // A comma-separated list, made space-separated byte by byte; an empty entry leaves
                // two spaces, or one at an end, which `checked` refuses. None: the configured scopes.
                let found: Result<LeasedChild<Provider>, ChildRefusal>
                if let scopes = try QueryParameters.values(GCEQuery.token, request)[0] {
                    found = try gce.scopesMemo.child(for: scopes) { () throws(BadRequest) in
                        let scope =
                            scopes.utf8.contains(0x2C)
                            ? String(decoding: scopes.utf8.map { $0 == 0x2C ? 0x20 : $0 }, as: UTF8.self) : scopes
                        return try Self.checked(audience: nil, scope: scope, for: gce.tokens)
                    }
                } else {
                    found = try gce.defaultScopesMemo.child(for: "") { () throws(BadRequest) in
                        try Self.checked(audience: nil, scope: gce.defaultScope, for: gce.tokens)
                    }
                }
                return token(from: gce.tokens, child: found, rendering: gce.tokenRendering, counter: counter)
            case .identity?:
                guard let identities = gce.identities else { break }
                let named = try QueryParameters.values(GCEQuery.identity, request)
                guard let audience = named[0] else { throw BadRequest(.missingParameter("audience")) }
                if let format = named[1], format != "standard", format != "full" {
                    throw BadRequest(.invalidParameter("format", allowed: "standard or full"))
                }
                // Read only to be checked: the broker's identity tokens carry no licence codes.
                if let licenses = named[2], !Self.isBoolean(licenses) {
                    throw BadRequest(.invalidParameter("licenses", allowed: "TRUE or FALSE"))
                }
                let found = try identities.memo.child(for: audience) { () throws(BadRequest) in
                    try Self.checked(audience: audience, scope: nil, for: identities.source)
                }
                return token(
                    from: identities.source, child: found, rendering: gce.identityRendering, counter: counter)
            case nil:
                break
            }
        } catch {
            return refuse(error.answer, .gce, counter)
        }
        return refuse(.notFound(path: request.path), .gce, counter)
    }

    /// Whether `value` is `TRUE` or `FALSE`, as the metadata server writes them, in any case.
    static func isBoolean(_ value: String) -> Bool {
        let lowercased = value.lowercased()
        return lowercased == "true" || lowercased == "false"
    }

    /// `TokenRequestValues.checked` for a protocol's template, refused as a 400 naming the parameter.
    static func checked(audience: String?, scope: String?, resource: String? = nil, for source: Source)
        throws(BadRequest) -> TokenRequestValues
    {
        switch TokenRequestValues.checked(
            audience: audience, scope: scope, resource: resource, for: source.configuration)
        {
        case .success(let values): return values
        case .failure(let problem): throw BadRequest(.requestValue(problem, provider: source.configuration.name))
        }
    }
}

/// The query parameters the metadata server's routes read.
enum GCEQuery {
    static let account = QueryNames(["recursive"])
    static let token = QueryNames(["scopes"])
    static let identity = QueryNames(["audience", "format", "licenses"])
}
