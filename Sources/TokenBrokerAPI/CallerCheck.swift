import TokenBrokerCore
import TokenBrokerServer

/// The answers to callers without a key, with an unknown key, or reading a provider outside
/// their list. They name the caller and the provider, never the key.
enum CallerCheck {
    private static let missing = HTTPResponse.error(
        401, "missing_caller_key", "token routes need a caller key: send Authorization: Bearer <key>",
        headers: [("WWW-Authenticate", "Bearer realm=\"token-broker\"")])
    private static let unknown = HTTPResponse.error(
        401, "invalid_caller_key", "the caller key is not listed in clientKeysFile",
        headers: [("WWW-Authenticate", "Bearer realm=\"token-broker\", error=\"invalid_token\"")])

    /// Nil when the request may read `provider`, else the 401 or 403 to send.
    static func refusal(_ decision: CallerDecision, provider: String) -> HTTPResponse? {
        switch decision {
        case .allowed: nil
        case .missingKey: missing
        case .unknownKey: unknown
        case .forbidden(let caller):
            .error(403, "provider_not_allowed", "caller \(JSONText.quoted(caller)) may not read provider \(JSONText.quoted(provider))")
        }
    }
}
