// Every error the broker answers over HTTP, with its status, `error` code, description and
// headers, in one place: both listeners' routes, the server's own refusals, and proxy mode.
import TokenBrokerCore
import TokenBrokerServer

/// An error answer, in the `{"error": "...", "error_description": "..."}` shape: what each one
/// says and which headers (`Allow`, `Retry-After`, `WWW-Authenticate`, `Connection: close`) it carries.
///
/// Routes build error answers only through `response`; answers that never vary are built once.
public enum ErrorAnswer: Sendable, Equatable {
    // MARK: Routing

    /// No route for the path (404 `not_found`).
    case notFound(path: String)
    /// The route exists, the method does not (405 `method_not_allowed`, with `Allow`).
    case methodNotAllowed(method: String, allow: [String])
    /// A request target in absolute form (`GET http://host/path`): the broker is not a forward proxy.
    case absoluteForm
    /// `/providers/{name}/...` names no provider (404 `unknown_provider`).
    case unknownProvider(name: String)

    // MARK: The server's refusals (`ServerRefusal`)

    /// An ambiguous or malformed request head; the connection closes, since where the body ends is not known.
    case malformedHead(problem: String)
    /// A target with more query arguments than the connection's memory holds (414 `uri_too_long`);
    /// answered at the head, so the connection closes.
    case tooManyQueryArguments
    /// A request head that leaves too little of the connection's memory for the answer's head
    /// (431 `request_header_fields_too_large`); answered at the head, so the connection closes.
    case headTooLarge
    /// A request still waiting when the broker stops, or when a reload removes its provider
    /// (503, `Retry-After: 1`).
    case shuttingDown
    /// A new request while the broker stops (503, `Retry-After: 1`); the connection closes after it.
    case refusedWhileStopping
    /// The client closed its side while its request waited (503); a client that only half-closed
    /// still reads it.
    case clientClosed
    /// The request would wait, and each of the listener's `places` for waiting requests (seven
    /// eighths of its connection limit) is taken (503 `too_many_waiting`, `Retry-After: 1`).
    /// 503, not 429: the listener is full, which this caller need not have caused, and without
    /// caller keys the broker cannot tell whose requests fill it (RFC 9110 §15.6.4).
    case tooManyWaiting(places: Int)

    // MARK: Who may ask

    /// The request guard: `Token-Broker-Request: true` is missing (403).
    case missingRequestHeader
    /// The request guard, and the cloud SDK routes' own: the request was relayed by a proxy
    /// (`X-Forwarded-For` or `Forwarded`) (403).
    case forwardedRequest
    /// Callers have keys and none was sent (401, with `WWW-Authenticate`).
    case missingCallerKey
    /// The key sent is not listed (401, with `WWW-Authenticate` saying `invalid_token`).
    case invalidCallerKey
    /// The caller may not read this provider (403); names the caller, never the key.
    case providerNotAllowed(caller: String, provider: String)
    /// The request would wait, and the caller's key already has `places` requests waiting, the
    /// most one key may: half the listener's places for waiting requests (429
    /// `too_many_waiting_for_key`, `Retry-After: 1`). 429: this caller, told by its key, sent
    /// too many (RFC 6585 §4); the others' places are still free.
    case tooManyWaitingForKey(places: Int)

    // MARK: Query and body of the token routes

    /// A query parameter that must be a whole number (`after`) is not one.
    case notAWholeNumber(parameter: String)
    /// `timeout` is not a whole number of seconds from `minimum`.
    case invalidTimeout(minimum: UInt64)
    /// A query parameter given more than once.
    case repeatedParameter(String)
    /// The `/token/refresh` body is longer than the broker reads (413).
    case bodyTooLarge
    /// The `/token/refresh` body is not a JSON object.
    case refreshBodyNotObject
    /// The `/token/refresh` body has a key other than `rejected_version`.
    case refreshBodyUnknownKey(String)
    /// `rejected_version` is not a whole number in range.
    case invalidRejectedVersion

    // MARK: A template's children (`perRequest`)

    /// A value named for a template's child (`audience`, `scope`, `resource`) that the provider
    /// does not take, that is malformed (400 `invalid_request`), or that is outside the
    /// template's allow-list (400 `value_not_allowed`); the body's `parameter` names it.
    case requestValue(RequestValueProblem, provider: String)
    /// The template keeps `maxChildren` children already (503 `too_many_children`, with
    /// `Retry-After`: when the earliest idle child could be dropped).
    case tooManyChildren(provider: String, limit: Int, retryAfter: Duration)

    // MARK: The cloud SDKs' protocols (`CompatAPI`)

    /// Google's metadata server: the request lacks `Metadata-Flavor: Google` (403).
    case missingMetadataFlavor
    /// Azure IMDS: the request lacks `Metadata: true` (400).
    case missingMetadataHeader
    /// Azure App Service: `X-IDENTITY-HEADER` is missing or not the configured secret (401).
    case invalidIdentityHeader
    /// Azure: `api-version` is missing or not the protocol's (400).
    case invalidAPIVersion(expected: String)
    /// A query parameter the route requires is missing (400).
    case missingParameter(String)
    /// A query parameter holds a value the route does not take (400); `allowed` says what it takes.
    case invalidParameter(String, allowed: String)
    /// Azure: more than one of `client_id`, `object_id`, `mi_res_id`, `msi_res_id` (400).
    case conflictingIdentityParameters
    /// Azure: no configured identity has the id asked for (400, never 404, which SDKs retry).
    case identityNotFound
    /// A compatibility route on a loopback listener: the `Host` names neither loopback nor a
    /// metadata server, as a web page's requests do after DNS rebinding (403).
    case foreignHost

    // MARK: Tokens

    /// The provider has no valid token (503 `token_unavailable`, with `Retry-After`): says why
    /// when it knows (the last upstream error, a pause that the request ended).
    /// - Parameters:
    ///   - paused: the provider was, or the request found it, paused while idle.
    ///   - retryAfter: what is left of the issuer's `Retry-After` (`ProviderStatus.heldOffFor`),
    ///     not what the issuer first said; nil: 1 s.
    case tokenUnavailable(provider: String, lastError: TokenFetchError?, paused: Bool, retryAfter: Duration? = nil)
    /// A forced refresh past the refresh window (429 `excessive_refresh`, with `Retry-After`).
    case excessiveRefresh(provider: String, attempts: Int, windowSeconds: Int, retryAfter: Duration)

    // MARK: Proxy mode

    /// The path under `/proxy/` is malformed or escapes its proxy's base path (400). The routes
    /// never send it for `.notUnderProxy` (no proxy's name: 404 `notFound`) or `.absoluteForm` (`absoluteForm`).
    case invalidProxyPath(ProxyPathProblem)
    /// `/proxy/{name}/` names no proxy (404 `unknown_proxy`).
    case unknownProxy(name: String)
    /// A method proxy mode does not forward (405 `method_not_allowed`, with `Allow`).
    case methodNotForwarded(method: String, allow: [String])
    /// A body longer than the proxy's `maxBodyBytes` (413 `payload_too_large`).
    case proxyBodyTooLarge(proxy: String, maxBytes: Int)
    /// No token could be had for the proxied request (503 `token_unavailable`, with `Retry-After`),
    /// with what `tokenUnavailable` says of the provider: the last upstream error, and what is left
    /// of the issuer's `Retry-After` (nil: 1 s).
    case proxyTokenUnavailable(
        proxy: String, provider: String, lastError: TokenFetchError? = nil, retryAfter: Duration? = nil)
    /// The token cannot be sent as a cookie (502 `token_not_cookie_safe`).
    case tokenNotCookieSafe(proxy: String, provider: String)
    /// The proxy's target did not answer in time (504 `upstream_timeout`).
    case upstreamTimeout(proxy: String, timeoutMsec: Int)
    /// The proxy's target could not be reached (502 `upstream_unreachable`); `problem` is the
    /// upstream error's summary, when there was one.
    case upstreamUnreachable(proxy: String, problem: String?)

    // MARK: Reload (`POST /reload`)

    /// The configuration file is not valid (422 `invalid_configuration`); nothing changed.
    case reloadInvalid(problem: String)
    /// The file changes what only a restart can (409 `reload_refused`); nothing changed.
    case reloadRefused(problem: String)
    /// A new provider, or a token file, got no token in time (503 `reload_abandoned`); nothing changed.
    case reloadAbandoned(problem: String)

    /// The HTTP status.
    public var status: Int {
        switch self {
        case .notFound, .unknownProvider, .unknownProxy: 404
        case .methodNotAllowed, .methodNotForwarded: 405
        case .absoluteForm, .malformedHead, .notAWholeNumber, .invalidTimeout, .repeatedParameter,
            .refreshBodyNotObject,
            .refreshBodyUnknownKey, .invalidRejectedVersion, .invalidProxyPath, .requestValue, .missingMetadataHeader,
            .invalidAPIVersion, .missingParameter, .invalidParameter, .conflictingIdentityParameters, .identityNotFound:
            400
        case .shuttingDown, .refusedWhileStopping, .clientClosed, .tokenUnavailable, .proxyTokenUnavailable,
            .tooManyChildren, .tooManyWaiting:
            503
        case .missingRequestHeader, .forwardedRequest, .providerNotAllowed, .missingMetadataFlavor, .foreignHost: 403
        case .missingCallerKey, .invalidCallerKey, .invalidIdentityHeader: 401
        case .bodyTooLarge, .proxyBodyTooLarge: 413
        case .excessiveRefresh, .tooManyWaitingForKey: 429
        case .tokenNotCookieSafe, .upstreamUnreachable: 502
        case .upstreamTimeout: 504
        case .reloadInvalid: 422
        case .reloadRefused: 409
        case .reloadAbandoned: 503
        case .tooManyQueryArguments: 414
        case .headTooLarge: 431
        }
    }

    /// The `error` member: a short code clients branch on.
    public var code: String {
        switch self {
        case .notFound: "not_found"
        case .methodNotAllowed, .methodNotForwarded: "method_not_allowed"
        case .absoluteForm, .malformedHead, .notAWholeNumber, .invalidTimeout, .repeatedParameter,
            .refreshBodyNotObject,
            .refreshBodyUnknownKey, .invalidRejectedVersion, .invalidProxyPath, .invalidAPIVersion, .missingParameter,
            .invalidParameter, .conflictingIdentityParameters:
            "invalid_request"
        case .missingMetadataFlavor: "missing_metadata_flavor"
        case .missingMetadataHeader: "missing_metadata_header"
        case .invalidIdentityHeader: "invalid_identity_header"
        case .identityNotFound: "identity_not_found"
        case .foreignHost: "foreign_host"
        case .requestValue(let problem, _): problem.kind == .notAllowed ? "value_not_allowed" : "invalid_request"
        case .tooManyChildren: "too_many_children"
        case .unknownProvider: "unknown_provider"
        case .shuttingDown, .refusedWhileStopping: "shutting_down"
        case .clientClosed: "client_closed"
        case .tooManyWaiting: "too_many_waiting"
        case .tooManyWaitingForKey: "too_many_waiting_for_key"
        case .missingRequestHeader: "missing_request_header"
        case .forwardedRequest: "forwarded_request"
        case .missingCallerKey: "missing_caller_key"
        case .invalidCallerKey: "invalid_caller_key"
        case .providerNotAllowed: "provider_not_allowed"
        case .bodyTooLarge, .proxyBodyTooLarge: "payload_too_large"
        case .tokenUnavailable, .proxyTokenUnavailable: "token_unavailable"
        case .excessiveRefresh: "excessive_refresh"
        case .unknownProxy: "unknown_proxy"
        case .tokenNotCookieSafe: "token_not_cookie_safe"
        case .upstreamTimeout: "upstream_timeout"
        case .upstreamUnreachable: "upstream_unreachable"
        case .reloadInvalid: "invalid_configuration"
        case .reloadRefused: "reload_refused"
        case .reloadAbandoned: "reload_abandoned"
        case .tooManyQueryArguments: "uri_too_long"
        case .headTooLarge: "request_header_fields_too_large"
        }
    }

    /// The `error_description` member: what went wrong, in words, never holding a secret.
    public var description: String {
        switch self {
        case .notFound(let path):
            "no route for \(String(path.prefix(200)))"
        case .methodNotAllowed(let method, let allow):
            "\(String(method.prefix(32))) is not allowed here; allowed: \(allow.joined(separator: ", "))"
        case .absoluteForm:
            "request targets must be paths (origin form); absolute URLs are refused"
        case .unknownProvider(let name):
            "no provider is named \(JSONText.quoted(String(name.prefix(64))))"
        case .malformedHead(let problem):
            problem
        case .tooManyQueryArguments:
            "the request target has more query arguments than the connection's memory holds beside it "
                + "(about 64 bytes each, within three quarters of connectionMemoryKiB)"
        case .headTooLarge:
            "the request's headers leave too little of the connection's memory (connectionMemoryKiB) "
                + "for the answer's head: 512 bytes, besides about 64 for each header, query argument and cookie"
        case .shuttingDown:
            "the broker is stopping, or a configuration reload removed the provider"
        case .refusedWhileStopping:
            "the broker is stopping"
        case .clientClosed:
            "the client closed the connection"
        case .tooManyWaiting(let places):
            "all \(places) places this listener keeps for waiting requests (seven eighths of connectionLimit) are taken; requests answered at once are still served; try again in 1 s"
        case .tooManyWaitingForKey(let places):
            "this caller key has \(places) requests waiting, the most one key may (half the listener's places for waiting requests); try again in 1 s"
        case .missingRequestHeader:
            "this route needs the request header \"\(RequestGuard.headerName): true\""
        case .forwardedRequest:
            "requests relayed by a proxy (with X-Forwarded-For or Forwarded) are refused"
        case .missingCallerKey:
            "token routes need a caller key: send Authorization: Bearer <key>"
        case .invalidCallerKey:
            "the caller key is not listed in clientKeysFile"
        case .providerNotAllowed(let caller, let provider):
            "caller \(JSONText.quoted(caller)) may not read provider \(JSONText.quoted(provider))"
        case .notAWholeNumber(let name):
            "\(name) must be a whole number from 0, such as \(name)=3"
        case .invalidTimeout(let minimum):
            "timeout must be a whole number of seconds from \(minimum), such as timeout=30"
        case .repeatedParameter(let name):
            "\(name) is given more than once"
        case .bodyTooLarge:
            "the body is larger than the broker accepts"
        case .refreshBodyNotObject:
            "the body must be a JSON object such as {\"rejected_version\": 3}"
        case .refreshBodyUnknownKey(let key):
            "unknown key \(JSONText.quoted(String(key.prefix(64)))) in the body; allowed: rejected_version"
        case .invalidRejectedVersion:
            "rejected_version must be a whole number from 0 to 999999999999999, the version of the rejected token"
        case .missingMetadataFlavor:
            "metadata requests need the header \"Metadata-Flavor: Google\""
        case .missingMetadataHeader:
            "managed identity requests need the header \"Metadata: true\""
        case .invalidIdentityHeader:
            "X-IDENTITY-HEADER is missing or is not the secret this broker was given (identityHeaderFile)"
        case .invalidAPIVersion(let expected):
            "api-version must be \(expected)"
        case .missingParameter(let name):
            "\(name) is required"
        case .invalidParameter(let name, let allowed):
            "\(name) must be \(allowed)"
        case .conflictingIdentityParameters:
            "name the identity by one of client_id, object_id, mi_res_id and msi_res_id, not several"
        case .identityNotFound:
            "no managed identity with that id is configured"
        case .foreignHost:
            "the Host header names neither this machine's loopback nor a metadata server"
        case .tokenUnavailable(let provider, let lastError, let paused, _):
            Self.unavailableText(provider: provider, lastError: lastError, paused: paused)
        case .requestValue(let problem, let provider):
            Self.requestValueText(problem, provider: provider)
        case .tooManyChildren(let provider, let limit, let retryAfter):
            "provider \(JSONText.quoted(provider)) keeps at most \(limit) children (maxChildren) and has no room for another; try again in \(Self.seconds(retryAfter)) s"
        case .excessiveRefresh(let provider, let attempts, let window, let retryAfter):
            "provider \(JSONText.quoted(provider)) allows \(attempts) forced refreshes per \(window) s; try again in \(Self.seconds(retryAfter)) s"
        case .invalidProxyPath(.badCharacters), .invalidProxyPath(.notUnderProxy):  // the second is never sent
            "the path or query has characters that are not allowed raw (RFC 3986), or a bad percent-escape"
        case .invalidProxyPath(.escapesRoot):
            "the path climbs above the proxy's base path"
        case .invalidProxyPath(.encodedSeparator):
            "a path segment hides a slash, backslash, NUL, CR or LF in a percent-escape"
        case .invalidProxyPath(.dotSegmentWithParameters):
            "a path segment is a dot segment with parameters (..;), which some servers read as a dot segment"
        case .invalidProxyPath(.absoluteForm):
            ErrorAnswer.absoluteForm.description
        case .unknownProxy(let name):
            "no proxy is named \(JSONText.quoted(String(name.prefix(64))))"
        case .methodNotForwarded(let method, let allow):
            "\(String(method.prefix(32))) is not forwarded; allowed: \(allow.joined(separator: ", "))"
        case .proxyBodyTooLarge(let proxy, let maxBytes):
            "proxy \(JSONText.quoted(proxy)) accepts bodies up to \(maxBytes) bytes"
        case .proxyTokenUnavailable(let proxy, let provider, let lastError, _):
            "proxy \(JSONText.quoted(proxy)) has no token from provider \(JSONText.quoted(provider))"
                + (lastError.map { "; last upstream error: \($0.summary)" } ?? "")
        case .tokenNotCookieSafe(let proxy, let provider):
            "proxy \(JSONText.quoted(proxy)): the token of provider \(JSONText.quoted(provider)) holds a character a cookie value cannot (RFC 6265), so it is not sent"
        case .upstreamTimeout(let proxy, let timeoutMsec):
            "proxy \(JSONText.quoted(proxy)): the target did not answer within \(timeoutMsec) ms"
        case .upstreamUnreachable(let proxy, let problem):
            "proxy \(JSONText.quoted(proxy)): \(problem ?? "the target gave no answer")"
        case .reloadInvalid(let problem), .reloadRefused(let problem), .reloadAbandoned(let problem):
            "the configuration was not reloaded: \(problem)"
        }
    }

    /// The headers the answer carries besides `Content-Type` and `Cache-Control`.
    public var headers: [(String, String)] { headers(retryAfterAtMost: .max) }

    /// `headers`, with a `Retry-After` of at most `limit` seconds.
    private func headers(retryAfterAtMost limit: Int) -> [(String, String)] {
        switch self {
        case .methodNotAllowed(_, let allow), .methodNotForwarded(_, let allow):
            [("Allow", allow.joined(separator: ", "))]
        case .malformedHead, .tooManyQueryArguments, .headTooLarge:
            [("Connection", "close")]
        case .shuttingDown, .tooManyWaiting, .tooManyWaitingForKey:
            [("Retry-After", String(min(1, limit)))]
        case .refusedWhileStopping:
            [("Retry-After", String(min(1, limit))), ("Connection", "close")]
        case .missingCallerKey:
            [("WWW-Authenticate", "Bearer realm=\"token-broker\"")]
        case .invalidCallerKey:
            [("WWW-Authenticate", "Bearer realm=\"token-broker\", error=\"invalid_token\"")]
        case .tokenUnavailable(_, _, _, let retryAfter), .proxyTokenUnavailable(_, _, _, let retryAfter):
            [("Retry-After", String(min(retryAfter.map(Self.seconds) ?? 1, limit)))]
        case .excessiveRefresh(_, _, _, let retryAfter), .tooManyChildren(_, _, let retryAfter):
            [("Retry-After", String(min(Self.seconds(retryAfter), limit)))]
        default:
            []
        }
    }

    /// The answer to send. Answers that never vary are built once and shared.
    public var response: HTTPResponse {
        switch self {
        case .absoluteForm: Self.absoluteFormResponse
        case .shuttingDown: Self.shuttingDownResponse
        case .refusedWhileStopping: Self.refusedWhileStoppingResponse
        case .missingRequestHeader: Self.missingRequestHeaderResponse
        case .forwardedRequest: Self.forwardedRequestResponse
        case .missingCallerKey: Self.missingCallerKeyResponse
        case .invalidCallerKey: Self.invalidCallerKeyResponse
        default: build()
        }
    }

    /// The longest `Retry-After` an answer in a cloud SDK protocol's shape carries, in seconds.
    ///
    /// azure-core sleeps for whatever `Retry-After` says, and msal replays the 503 for as long:
    /// a template full until its earliest child has idled `childIdleSec` (an hour by default), or
    /// an issuer's long `Retry-After`, would hold an unchanged application that long without an
    /// error. Capped, the SDK retries within its own budget, then fails with the broker's words.
    static let protocolRetryAfterLimit = 5

    /// The answer in a cloud SDK protocol's shape (`CompatAPI`): Google's metadata server's
    /// carries `Metadata-Flavor: Google`, as its every answer does; Azure's body adds
    /// `statusCode` and `message`, which msal quotes when it fails.
    ///
    /// Its `Retry-After` is at most `protocolRetryAfterLimit`.
    func response(for protocolName: CompatProtocol) -> HTTPResponse {
        let headers = headers(retryAfterAtMost: Self.protocolRetryAfterLimit)
        switch protocolName {
        case .gce:
            return HTTPResponse(status: status, json: body, headers: headers + [CompatProtocol.metadataFlavor])
        case .azure:
            var members: [(String, String)] = [
                ("error", JSONText.quoted(code)), ("error_description", JSONText.quoted(description)),
            ]
            if case .requestValue(let problem, _) = self {
                members.append(("parameter", JSONText.quoted(problem.parameter.rawValue)))
            }
            members += [("statusCode", String(status)), ("message", JSONText.quoted(description))]
            return HTTPResponse(status: status, json: JSONText.object(members), headers: headers)
        }
    }

    /// The answer, built now.
    private func build() -> HTTPResponse {
        HTTPResponse(status: status, json: body, headers: headers)
    }

    /// The JSON body: `error` and `error_description`, and `parameter` for a request's value.
    private var body: String {
        guard case .requestValue(let problem, _) = self else { return JSONText.errorBody(code, description) }
        return JSONText.object([
            ("error", JSONText.quoted(code)), ("error_description", JSONText.quoted(description)),
            ("parameter", JSONText.quoted(problem.parameter.rawValue)),
        ])
    }

    private static let absoluteFormResponse = ErrorAnswer.absoluteForm.build()
    private static let shuttingDownResponse = ErrorAnswer.shuttingDown.build()
    private static let refusedWhileStoppingResponse = ErrorAnswer.refusedWhileStopping.build()
    private static let missingRequestHeaderResponse = ErrorAnswer.missingRequestHeader.build()
    private static let forwardedRequestResponse = ErrorAnswer.forwardedRequest.build()
    private static let missingCallerKeyResponse = ErrorAnswer.missingCallerKey.build()
    private static let invalidCallerKeyResponse = ErrorAnswer.invalidCallerKey.build()

    /// The answer to a request the server refuses itself, worded for both listeners.
    public static func refusal(_ reason: ServerRefusal) -> ErrorAnswer {
        switch reason {
        case .malformedHead(let problem): .malformedHead(problem: problem)
        case .tooManyQueryArguments: .tooManyQueryArguments
        case .headTooLarge: .headTooLarge
        case .stopping: .refusedWhileStopping
        case .stopped: .shuttingDown
        case .clientClosed: .clientClosed
        case .bodyTooLarge: .bodyTooLarge
        case .tooManyWaiting(_, let places): .tooManyWaiting(places: places)
        }
    }

    /// A wait in whole seconds for `Retry-After` and the texts that quote it: at least 1.
    private static func seconds(_ duration: Duration) -> Int { max(1, Int(clamping: duration.secondsRoundedUp)) }

    private static func requestValueText(_ problem: RequestValueProblem, provider: String) -> String {
        let name = problem.parameter.rawValue
        let quotedProvider = JSONText.quoted(provider)
        switch problem.kind {
        case .notAccepted:
            return "provider \(quotedProvider) does not take \(name) (see perRequest)"
        case .malformed where problem.parameter == .scope:
            return
                "scope must be scope tokens of visible ASCII characters but \" and \\, separated by single spaces, at most \(TokenRequestValues.maximumLength) bytes"
        case .malformed:
            return "\(name) must be 1 to \(TokenRequestValues.maximumLength) visible ASCII characters, without spaces"
        case .notAllowed:
            return "provider \(quotedProvider) does not allow this \(name) (see its allow-list)"
        case .missing:
            return "\(name) is required by this template: provider \(quotedProvider) has no default for it"
        }
    }

    private static func unavailableText(provider: String, lastError: TokenFetchError?, paused: Bool) -> String {
        var description = "provider \(JSONText.quoted(provider)) has no valid token"
        if let lastError { description += "; last upstream error: \(lastError.summary)" }
        if paused {
            description += "; refresh was paused while idle and has resumed: wait for the new token at /token/ready"
        }
        return description
    }
}
