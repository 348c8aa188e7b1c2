import TokenBrokerCore

/// Who may read which provider, asked as a request arrives (`admit`) and again as a request that
/// waited is answered (`recheck`): the callers' list may change meanwhile (`clientKeysFile` is
/// re-read when it changes), and a caller whose key was removed, or whose list no longer holds
/// the provider, must not be handed a token after that, however long its request was suspended.
public protocol CallerRechecking: CallerAuthorizing {
    /// `authorize`'s decision; for a caller allowed, what `recheck` needs to ask again without
    /// the key.
    func admit(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerAdmission
    /// The decision for `caller` reading the provider `admit` allowed it, by the callers listed
    /// now: `.allowed` while its key is listed with the provider, `.unknownKey` once its key is
    /// not listed, `.forbidden` once its list leaves the provider out.
    func recheck(_ caller: AdmittedCaller) -> CallerDecision
}

/// `CallerRechecking.admit`'s answer.
public enum CallerAdmission: Sendable, Equatable {
    case allowed(AdmittedCaller)
    /// Any decision but `.allowed`.
    case refused(CallerDecision)

    /// The decision, as `authorize` gives it.
    public var decision: CallerDecision {
        switch self {
        case .allowed: .allowed
        case .refused(let decision): decision
        }
    }
}

/// A caller `admit` let in, as a suspended request keeps it until it is answered: made of what
/// the check already had (no key is kept, and nothing is hashed again).
public struct AdmittedCaller: Sendable, Equatable {
    /// What finds the caller's key in a later list: for `CallerKeyStore`, the key's SHA-256, the
    /// listed entry's (shared, not copied).
    public let keyDigest: [UInt8]
    /// The provider the caller was let read.
    public let provider: String
    /// The list that let it in, as its checker numbers the lists it has held: while that list is
    /// in force, `recheck` has nothing to look up.
    public let list: UInt64

    public init(keyDigest: [UInt8], provider: String, list: UInt64) {
        self.keyDigest = keyDigest
        self.provider = provider
        self.list = list
    }
}

/// A caller let in, with the checker that let it in: what a proxied request keeps, so that it is
/// asked again before the request goes on after a wait (for its body, its token, a refresh) on
/// the caller's behalf.
public struct CallerRecheck: Sendable {
    public let caller: AdmittedCaller
    let callers: any CallerRechecking

    init(_ caller: AdmittedCaller, by callers: any CallerRechecking) {
        self.caller = caller
        self.callers = callers
    }

    /// Nil while the caller may still read its provider by the callers listed now; else the
    /// 401 `invalid_caller_key` or 403 `provider_not_allowed` that a request arriving now would
    /// get, as a token route's waited request gets when answered.
    public func refusal() -> ErrorAnswer? {
        CallerCheck.refusal(callers.recheck(caller), provider: caller.provider)
    }
}

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
