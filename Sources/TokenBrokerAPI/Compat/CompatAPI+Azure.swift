import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerServer

/// Azure managed identity, as azure-identity (through msal) and the other Azure SDKs ask it:
///
/// | route | protocol | guard | answer |
/// |---|---|---|---|
/// | `GET /msi/token?api-version=2019-08-01&resource=R` | App Service (`IDENTITY_ENDPOINT`, `IDENTITY_HEADER`) | `X-IDENTITY-HEADER`: the secret, else 401 | `access_token`, `expires_on`, `resource`, `token_type` |
/// | `GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=R` | IMDS (`AZURE_POD_IDENTITY_AUTHORITY_HOST`) | `Metadata: true`, else 400 | the same and `expires_in` |
///
/// `client_id`, `object_id` (or `principal_id`), `mi_res_id` or `msi_res_id` name a
/// user-assigned identity; none, the system-assigned one. An identity not configured is a 400,
/// never a 404, which msal retries. `R` goes to the identity's template's child as `resource`,
/// or as the scope `R/.default` when the template takes scopes (Microsoft Entra's convention).
/// Errors carry `statusCode` and `message` besides `error` and `error_description`.
extension CompatAPI {
    /// What managed identity serves: its identities, App Service's secret, its renderings and counters.
    struct Azure: Sendable {
        /// One configured identity and the template of its tokens.
        struct Identity: Sendable {
            let settings: AzureConfiguration.Identity
            let source: Source
        }

        let identities: [Identity]
        /// The SHA-256 of App Service's secret; nil: `/msi/token` is not served. A request's
        /// header is compared by its hash, so that the time taken says nothing of the secret,
        /// not even its length.
        let identityHeaderHash: [UInt8]?
        let appServiceCounter: RequestCounter
        let imdsCounter: RequestCounter

        static var appServicePath: String { "/msi/token" }
        static var imdsPath: String { "/metadata/identity/oauth2/token" }
        /// msal treats a token with less than 5 minutes left as expired.
        static var margin: Duration { .seconds(300) }

        init(
            _ settings: AzureConfiguration, identities: [(AzureConfiguration.Identity, Source)],
            identityHeader: [UInt8]?,
            listener: String, metrics: BrokerMetrics
        ) {
            self.identities = identities.map { Identity(settings: $0.0, source: $0.1) }
            identityHeaderHash =
                settings.identityHeaderFile == nil ? nil : identityHeader.flatMap { try? Crypto.sha256($0) }
            appServiceCounter = metrics.counter(listener: listener, route: Self.appServicePath)
            imdsCounter = metrics.counter(listener: listener, route: Self.imdsPath)
        }

        func serves(_ path: String) -> Bool {
            path == Self.imdsPath || (identityHeaderHash != nil && path == Self.appServicePath)
        }

        /// The identity a request names by at most one id; nil: not configured.
        func identity(_ request: HTTPRequest) throws(BadRequest) -> Identity {
            let ids: [(String, KeyPath<AzureConfiguration.Identity, String?>)] = [
                ("client_id", \.clientId), ("object_id", \.objectId), ("principal_id", \.objectId),
                ("mi_res_id", \.resourceId), ("msi_res_id", \.resourceId),
            ]
            var named: (String, KeyPath<AzureConfiguration.Identity, String?>)?
            for (name, key) in ids {
                guard let value = try CompatAPI.single(name, request) else { continue }
                if named != nil { throw BadRequest(.conflictingIdentityParameters) }
                named = (value, key)
            }
            let found =
                if let (value, key) = named {
                    identities.first { $0.settings[keyPath: key] == value }
                } else {
                    identities.first { $0.settings.isSystemAssigned }
                }
            guard let found else { throw BadRequest(.identityNotFound) }
            return found
        }
    }

    /// Answers one managed identity request (`serves` said the path is its).
    func handleAzure(_ request: HTTPRequest) -> HTTPReply {
        guard let azure else { preconditionFailure("a managed identity path without managed identity") }
        let appService = request.path == Azure.appServicePath
        let counter = appService ? azure.appServiceCounter : azure.imdsCounter
        if request.method != "GET" {
            return refuse(.methodNotAllowed(method: request.method, allow: ["GET"]), .azure, counter)
        }
        if request.header("X-Forwarded-For") != nil { return refuse(.forwardedRequest, .azure, counter) }
        if appService {
            guard let secret = azure.identityHeaderHash, let sent = request.header("X-IDENTITY-HEADER"),
                let hash = try? Crypto.sha256(sent.utf8), Crypto.constantTimeEqual(hash, secret)
            else { return refuse(.invalidIdentityHeader, .azure, counter) }
        } else if request.header("Metadata")?.lowercased() != "true" {
            return refuse(.missingMetadataHeader, .azure, counter)
        }
        let apiVersion = appService ? "2019-08-01" : "2018-02-01"
        do throws(BadRequest) {
            guard try Self.single("api-version", request) == apiVersion else {
                throw BadRequest(.invalidAPIVersion(expected: apiVersion))
            }
            guard let resource = try Self.single("resource", request) else {
                throw BadRequest(.missingParameter("resource"))
            }
            let identity = try azure.identity(request)
            let values: TokenRequestValues
            if identity.source.configuration.perRequest.contains(.resource) {
                values = try Self.checked(audience: nil, scope: nil, resource: resource, for: identity.source)
            } else {
                // One scope, `R/.default`: a resource with a space would name several.
                guard !resource.utf8.contains(0x20) else {
                    throw BadRequest(
                        .requestValue(
                            RequestValueProblem(parameter: .resource, kind: .malformed),
                            provider: identity.source.configuration.name))
                }
                values = try Self.checked(audience: nil, scope: resource + "/.default", for: identity.source)
            }
            let rendering = Self.azureRendering(
                appService: appService, resource: resource,
                tokenDelay: identity.source.configuration.tokenRefreshDelaySec)
            return token(from: identity.source, values: values, rendering: rendering, counter: counter)
        } catch {
            return refuse(error.answer, .azure, counter)
        }
    }

    /// How each protocol's answer looks: `expires_on` in epoch seconds (App Service), and
    /// `expires_in` too (IMDS), both JSON integers. A token without an expiry is replaced within
    /// `tokenDelay` seconds (`tokenRefreshDelaySec`): the SDK is told so. The answer depends on
    /// `resource`, which is the same for every request that reaches the same child.
    static func azureRendering(appService: Bool, resource: String, tokenDelay: Int) -> Rendering {
        Rendering(format: appService ? .azureAppService : .azureIMDS, protocolName: .azure, margin: Azure.margin) {
            token, expiresIn in
            // A lifetime is at most `Duration.checkedLimitSeconds`, so this fits; checked all the same.
            let expiresAt = token.expiresAtDate ?? WallTime().addingTimeInterval(Double(tokenDelay))
            let expiresOn = Int(rounding: expiresAt.timeIntervalSince1970, .down) ?? Int.max
            var members: [(String, String)] = [("access_token", JSONText.quoted(token.token.accessToken))]
            if !appService { members.append(("expires_in", String(expiresIn ?? tokenDelay))) }
            members += [
                ("expires_on", String(expiresOn)), ("resource", JSONText.quoted(resource)),
                ("token_type", "\"Bearer\""),
            ]
            return HTTPResponse(status: 200, json: JSONText.object(members))
        }
    }
}
