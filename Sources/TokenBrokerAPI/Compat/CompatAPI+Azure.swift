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
/// App Service's route is served with `identityHeaderFile`; IMDS's when `servesIMDS` says so (by
/// default only without `identityHeaderFile`: IMDS has no secret, and beside App Service's route
/// it would hand the same tokens to a client without it).
///
/// `client_id`, `object_id` (or `principal_id`), `mi_res_id` or `msi_res_id` name a
/// user-assigned identity; none, the system-assigned one. An identity not configured is a 400,
/// never a 404, which msal retries. `R` goes to the identity's template's child as `resource`,
/// or as the scope `R/.default` when the template takes scopes (Microsoft Entra's convention).
/// Errors carry `statusCode` and `message` besides `error` and `error_description`.
extension CompatAPI {
    /// What managed identity serves: its identities, App Service's secret, its renderings and counters.
    ///
    /// A class, so that reading it per request costs one reference count, not one per setting.
    final class Azure: Sendable {
        /// One configured identity and the template of its tokens.
        struct Identity: Sendable {
            let settings: AzureConfiguration.Identity
            let source: Source
            /// The values last checked for a `resource`, with their child.
            let memo: CheckedValuesMemo<String, Provider>

            init(settings: AzureConfiguration.Identity, source: Source) {
                self.settings = settings
                self.source = source
                memo = CheckedValuesMemo(source.template)
            }
        }

        let identities: [Identity]
        /// App Service's secret; nil: `/msi/token` is not served.
        let identityHeader: [UInt8]?
        /// Whether `/metadata/identity/oauth2/token` is served (`AzureConfiguration.servesIMDS`).
        let servesIMDS: Bool
        /// How each protocol renders its answers (`azureRendering`), by identity, in `identities`' order.
        let appServiceRenderings: [Rendering]
        let imdsRenderings: [Rendering]
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
            self.identityHeader = settings.identityHeaderFile == nil ? nil : identityHeader
            servesIMDS = settings.servesIMDS
            let delays = identities.map { $0.1.configuration.tokenRefreshDelaySec }
            appServiceRenderings = delays.map { CompatAPI.azureRendering(appService: true, tokenDelay: $0) }
            imdsRenderings = delays.map { CompatAPI.azureRendering(appService: false, tokenDelay: $0) }
            appServiceCounter = metrics.counter(listener: listener, route: Self.appServicePath)
            imdsCounter = metrics.counter(listener: listener, route: Self.imdsPath)
        }

        func serves(_ path: String) -> Bool {
            // Byte for byte first, as SDKs send the paths; `String`'s `==` (canonical
            // equivalence) answers for any other path, as it always has.
            if (servesIMDS && path.isExactly(Self.imdsPath))
                || (identityHeader != nil && path.isExactly(Self.appServicePath))
            {
                return true
            }
            return (servesIMDS && path == Self.imdsPath) || (identityHeader != nil && path == Self.appServicePath)
        }

        /// Whether `path` (one `serves` accepted) is App Service's: `path == appServicePath`,
        /// answered from the bytes for the two paths as SDKs send them.
        static func isAppService(_ path: String) -> Bool {
            if path.isExactly(appServicePath) { return true }
            if path.isExactly(imdsPath) { return false }
            return path == appServicePath
        }

        /// The index in `identities` of the one the ids name (`AzureQuery.idNames`' values, from
        /// `AzureQuery.firstId` in `named`; at most one; none: the system-assigned one).
        func identity(_ named: QueryValues) throws(BadRequest) -> Int {
            var asked: (value: String, id: Int)?
            for id in AzureQuery.idNames.indices {
                guard let value = named[AzureQuery.firstId + id] else { continue }
                if asked != nil { throw BadRequest(.conflictingIdentityParameters) }
                asked = (value, id)
            }
            let found =
                if let asked {
                    // Azure's ids (GUIDs, resource ids) are the same in any case.
                    identities.firstIndex {
                        AzureQuery.id(asked.id, of: $0.settings)?.equalsIgnoringASCIICase(asked.value) == true
                    }
                } else {
                    identities.firstIndex { $0.settings.isSystemAssigned }
                }
            guard let found else { throw BadRequest(.identityNotFound) }
            return found
        }

        /// Whether `sent` is App Service's secret, in time that depends only on the secret's
        /// length: a header of another length is compared with the secret itself, and refused.
        func isIdentityHeader(_ sent: UnsafeBufferPointer<UInt8>?) -> Bool {
            guard let secret = identityHeader, let sent else { return false }
            let sameLength = sent.count == secret.count
            // A header of another length is not compared; the secret is compared with itself
            // instead, so that the time taken does not depend on the header either way.
            let equal = sameLength ? Crypto.constantTimeEqual(sent, secret) : Crypto.constantTimeEqual(secret, secret)
            return sameLength && equal
        }
    }

    /// Answers one managed identity request (`serves` said the path is its).
    func handleAzure(_ request: HTTPRequest) -> HTTPReply {
        guard let azure else { preconditionFailure("a managed identity path without managed identity") }
        let appService = Azure.isAppService(request.path)
        let counter = appService ? azure.appServiceCounter : azure.imdsCounter
        if request.method != "GET" {
            return refuse(.methodNotAllowed(method: request.method, allow: ["GET"]), .azure, counter)
        }
        let headers = CompatHeaders.read(request)
        if headers.isRelayed { return refuse(.forwardedRequest, .azure, counter) }
        if let refusal = foreignHost(headers) { return refuse(refusal, .azure, counter) }
        if appService {
            guard headers.withValue(.identityHeader, azure.isIdentityHeader) else {
                return refuse(.invalidIdentityHeader, .azure, counter)
            }
        } else if !headers.value(.metadata, equalsIgnoringCase: "true") {
            return refuse(.missingMetadataHeader, .azure, counter)
        }
        let apiVersion = appService ? "2019-08-01" : "2018-02-01"
        do throws(BadRequest) {
            let named = try QueryParameters.values(AzureQuery.names, request)
            guard named[0] == apiVersion else { throw BadRequest(.invalidAPIVersion(expected: apiVersion)) }
            guard let resource = named[1] else { throw BadRequest(.missingParameter("resource")) }
            let index = try azure.identity(named)
            let source = azure.identities[index].source
            let found = try azure.identities[index].memo.child(for: resource) { () throws(BadRequest) in
                let values: TokenRequestValues
                if source.configuration.perRequest.contains(.resource) {
                    values = try Self.checked(audience: nil, scope: nil, resource: resource, for: source)
                } else {
                    // One scope, `R/.default`: a resource with a space would name several.
                    guard !resource.utf8.contains(0x20) else {
                        throw BadRequest(
                            .requestValue(
                                RequestValueProblem(parameter: .resource, kind: .malformed),
                                provider: source.configuration.name))
                    }
                    // A problem with that scope is one with the resource the request named.
                    switch TokenRequestValues.checked(
                        audience: nil, scope: resource + "/.default", resource: nil, for: source.configuration)
                    {
                    case .success(let checked): values = checked
                    case .failure(let problem):
                        throw BadRequest(
                            .requestValue(
                                RequestValueProblem(parameter: .resource, kind: problem.kind),
                                provider: source.configuration.name))
                    }
                }
                return values
            }
            let rendering = appService ? azure.appServiceRenderings[index] : azure.imdsRenderings[index]
            return token(from: source, child: found, rendering: rendering, resource: resource, counter: counter)
        } catch {
            return refuse(error.answer, .azure, counter)
        }
    }

    /// How each protocol's answer looks: `expires_on` in epoch seconds (App Service), and
    /// `expires_in` too (IMDS), both JSON integers. A token without an expiry is replaced within
    /// `tokenDelay` seconds (`tokenRefreshDelaySec`): the SDK is told so (`Answering.answerWithoutExpiry`).
    static func azureRendering(appService: Bool, tokenDelay: Int) -> Rendering {
        Rendering(format: appService ? .azureAppService : .azureIMDS, protocolName: .azure, margin: Azure.margin) {
            token, expiresIn, resource in
            // A lifetime is at most `Duration.checkedLimitSeconds`, so this fits; checked all the same.
            let expiresAt = token.expiresAtDate ?? token.issuedAtDate.addingTimeInterval(Double(tokenDelay))
            let expiresOn = Int(rounding: expiresAt.timeIntervalSince1970, .down) ?? Int.max
            var members: [(String, String)] = [("access_token", JSONText.quoted(token.token.accessToken))]
            if !appService { members.append(("expires_in", String(expiresIn))) }
            members += [
                ("expires_on", String(expiresOn)), ("resource", JSONText.quoted(resource)),
                ("token_type", "\"Bearer\""),
            ]
            return HTTPResponse(status: 200, json: JSONText.object(members))
        }
    }
}

/// The query parameters of both managed identity routes, read in one pass.
enum AzureQuery {
    /// `api-version`, `resource`, then the ids (`idNames`), from `firstId`.
    static let names = QueryNames(["api-version", "resource"] + idNames)
    /// The index in `names` of the first id.
    static let firstId = 2
    /// The parameters that name a user-assigned identity.
    static let idNames = ["client_id", "object_id", "principal_id", "mi_res_id", "msi_res_id"]

    /// The setting of `identity` that the id parameter `idNames[index]` is matched against.
    static func id(_ index: Int, of identity: AzureConfiguration.Identity) -> String? {
        switch index {
        case 0: identity.clientId
        case 1, 2: identity.objectId
        default: identity.resourceId
        }
    }
}
