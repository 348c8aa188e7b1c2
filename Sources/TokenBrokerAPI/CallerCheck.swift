import TokenBrokerCore

/// The answers to callers without a key, with an unknown key, or reading a provider outside
/// their list. They name the caller and the provider, never the key.
enum CallerCheck {
    /// Nil when the request may read `provider`, else the 401 or 403 to send.
    static func refusal(_ decision: CallerDecision, provider: String) -> ErrorAnswer? {
        switch decision {
        case .allowed: nil
        case .missingKey: .missingCallerKey
        case .unknownKey: .invalidCallerKey
        case .forbidden(let caller): .providerNotAllowed(caller: caller, provider: provider)
        }
    }
}

extension ErrorAnswer {
    /// The caller is known, and only this provider is outside its list (403 `provider_not_allowed`).
    var isProviderNotAllowed: Bool {
        if case .providerNotAllowed = self { return true }
        return false
    }
}
