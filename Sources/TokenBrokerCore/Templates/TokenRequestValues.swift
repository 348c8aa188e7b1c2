/// A parameter a request may name for a provider template's child (`perRequest`).
public enum RequestParameter: String, CaseIterable, Sendable, Hashable, Comparable {
    /// The audience: `audience` in an OAuth 2.0 token request, `aud` for the local signer.
    case audience
    /// The scope, a space-separated set (RFC 6749 §3.3).
    case scope
    /// The resource indicator (RFC 8707).
    case resource

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.order < rhs.order }

    private var order: Int {
        switch self {
        case .audience: 0
        case .scope: 1
        case .resource: 2
        }
    }
}

/// The values that make a template's child: what one request, or one sink, asked for.
///
/// Two requests that name the same values, once checked, get the same child: the scope set is
/// kept sorted and without repeats, so `read write` and `write read` are one child. A value not
/// named is nil, and the source then uses its configured default; a parameter that has none (one
/// an `http` source's placeholders use, see `ProviderConfiguration.requiredParameters`) must be named.
public struct TokenRequestValues: Hashable, Sendable, CustomStringConvertible {
    /// The audience asked for, or nil.
    public let audience: String?
    /// The scope set asked for, sorted and without repeats, or nil.
    public let scopes: [String]?
    /// The resource asked for, or nil.
    public let resource: String?
    /// The values' hash, taken once: a template looks its children up by their values on every
    /// request, and an SDK's values (a scope URL) are long to hash again each time.
    private let hash: Int

    /// No value named: the template's own defaults.
    public static let none = TokenRequestValues()

    public init(audience: String? = nil, scopes: [String]? = nil, resource: String? = nil) {
        self.audience = audience
        // Sorted, then repeats dropped: no set to hash for the common one or two scopes.
        self.scopes = scopes.map { list in
            guard list.count > 1 else { return list }
            var unique: [String] = []
            for scope in list.sorted() where unique.last != scope { unique.append(scope) }
            return unique
        }
        self.resource = resource
        var hasher = Hasher()
        hasher.combine(audience)
        hasher.combine(self.scopes)
        hasher.combine(resource)
        hash = hasher.finalize()
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.hash == rhs.hash && lhs.audience == rhs.audience && lhs.scopes == rhs.scopes
            && lhs.resource == rhs.resource
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(hash) }

    /// The scope set as the protocol sends it, space-separated, or nil.
    public var scope: String? { scopes?.joined(separator: " ") }

    /// The value named for `parameter`, as sent upstream (the scope set space-separated).
    public func value(_ parameter: RequestParameter) -> String? {
        switch parameter {
        case .audience: audience
        case .scope: scope
        case .resource: resource
        }
    }

    /// For logs: the parameters named, never their values' secrets (they are not secrets, but
    /// they are the caller's choice, so logs show them quoted).
    public var description: String {
        let named = RequestParameter.allCases.compactMap { parameter in
            value(parameter).map { "\(parameter.rawValue)=\"\($0)\"" }
        }
        return named.isEmpty ? "defaults" : named.joined(separator: " ")
    }

    /// The longest value a request may name, in bytes.
    public static let maximumLength = 1024

    /// Checks the values a request named against `configuration`'s `perRequest` and allow-lists.
    ///
    /// Values are whole printable ASCII (no control character, no space except between scopes),
    /// at most `maximumLength` bytes. A scope is a set of RFC 6749 scope tokens, each of which
    /// must be allowed. A provider that is not a template takes no value at all. Once the values
    /// named are good, a parameter of `configuration.requiredParameters` not named is `missing`.
    public static func checked(
        audience: String?, scope: String?, resource: String?, for configuration: ProviderConfiguration
    ) -> Result<TokenRequestValues, RequestValueProblem> {
        let named: [(RequestParameter, String?)] = [(.audience, audience), (.scope, scope), (.resource, resource)]
        for case (let parameter, let value?) in named {
            guard configuration.perRequest.contains(parameter) else {
                return .failure(RequestValueProblem(parameter: parameter, kind: .notAccepted))
            }
            guard !value.isEmpty, value.utf8.count <= maximumLength else {
                return .failure(RequestValueProblem(parameter: parameter, kind: .malformed))
            }
        }
        if let audience {
            guard audience.utf8.allSatisfy(Self.isVisibleASCII) else {
                return .failure(RequestValueProblem(parameter: .audience, kind: .malformed))
            }
            guard configuration.allowedAudiences.contains(where: { $0.matches(audience) }) else {
                return .failure(RequestValueProblem(parameter: .audience, kind: .notAllowed))
            }
        }
        if let resource {
            guard resource.utf8.allSatisfy(Self.isVisibleASCII) else {
                return .failure(RequestValueProblem(parameter: .resource, kind: .malformed))
            }
            guard configuration.allowedResources.contains(where: { $0.matches(resource) }) else {
                return .failure(RequestValueProblem(parameter: .resource, kind: .notAllowed))
            }
        }
        var scopes: [String]?
        if let scope {
            // RFC 6749 §3.3: scope = scope-token *( SP scope-token ), scope-token = 1*NQCHAR.
            // Split by byte, not by character: the checks below are all by byte.
            let tokens = scope.utf8.split(separator: 0x20, omittingEmptySubsequences: false).map {
                String(decoding: $0, as: UTF8.self)
            }
            guard tokens.allSatisfy({ !$0.isEmpty && $0.utf8.allSatisfy(Self.isScopeCharacter) }) else {
                return .failure(RequestValueProblem(parameter: .scope, kind: .malformed))
            }
            for token in tokens where !configuration.allowedScopes.contains(where: { $0.matches(token) }) {
                return .failure(RequestValueProblem(parameter: .scope, kind: .notAllowed))
            }
            scopes = tokens
        }
        // Fixed order, so that the parameter reported does not depend on a set's order.
        for (parameter, value) in named where value == nil && configuration.requiredParameters.contains(parameter) {
            return .failure(RequestValueProblem(parameter: parameter, kind: .missing))
        }
        return .success(TokenRequestValues(audience: audience, scopes: scopes, resource: resource))
    }

    /// `%x21-7E`: visible ASCII, no space.
    static func isVisibleASCII(_ byte: UInt8) -> Bool { byte >= 0x21 && byte <= 0x7E }

    /// RFC 6749's NQCHAR: `%x21 / %x23-5B / %x5D-7E`.
    static func isScopeCharacter(_ byte: UInt8) -> Bool { isVisibleASCII(byte) && byte != 0x22 && byte != 0x5C }
}

/// Why a request's value for a template's child was refused: a 400 that names the parameter.
public struct RequestValueProblem: Error, Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The provider does not take this parameter (it is not in `perRequest`, or the provider is no template).
        case notAccepted
        /// Empty, too long, or with characters a value may not hold.
        case malformed
        /// Outside the template's allow-list.
        case notAllowed
        /// Not named, though the template has no default for it: its `http` source's placeholders
        /// use it (`ProviderConfiguration.requiredParameters`).
        case missing
    }

    /// The parameter at fault.
    public let parameter: RequestParameter
    public let kind: Kind

    public init(parameter: RequestParameter, kind: Kind) {
        self.parameter = parameter
        self.kind = kind
    }
}

/// One entry of an allow-list (`allowedAudiences`, `allowedScopes`, `allowedResources`): an
/// exact value, or a prefix when it ends in `*` (`https://api.example/*`).
///
/// An exact entry is compared byte for byte, as it is. A prefix entry allows a value that starts
/// with the prefix unless the part after the prefix holds a backslash or a `.` or `..` path
/// segment: `/../` or `/./` anywhere, a start of `../` or `./`, an end of `/..` or `/.`, or the
/// whole part being `.` or `..`. So `https://api.example/*` allows `https://api.example/v1..`
/// and `https://api.example/.well-known/x` but not `https://api.example/v1/../admin`, which an
/// issuer or resource server may resolve to a path outside the prefix. Values are checked as the
/// request named them once percent-decoded (`%2e%2e` is `..`, `%2F` is `/`), and the escapes left
/// in a value after that are read as a server normalizing it would: `%2e` is a dot (RFC 3986
/// §6.2.2.2), `%2f` a slash and `%5c` a backslash (servers that decode them exist); `%25`, an
/// escape of an escape, is refused, as is a `%` not followed by two hex digits.
public struct AllowPattern: Sendable, Hashable, CustomStringConvertible {
    /// The value, or the prefix without its `*`.
    public let text: String
    /// True for a prefix (written with a trailing `*`).
    public let isPrefix: Bool

    /// Reads `https://a.example` or `https://a.example/*`; nil for an empty pattern, a lone `*`
    /// (allow-lists exist to be narrow), or a `*` anywhere but at the end.
    public init?(_ written: String) {
        let isPrefix = written.hasSuffix("*")
        let text = isPrefix ? String(written.dropLast()) : written
        guard !text.isEmpty, !text.contains("*"), text.utf8.allSatisfy(TokenRequestValues.isVisibleASCII) else {
            return nil
        }
        self.text = text
        self.isPrefix = isPrefix
    }

    /// Whether `value` is allowed by this entry: equal to it, or starting with its prefix and
    /// followed by no backslash and no dot segment.
    public func matches(_ value: some StringProtocol) -> Bool {
        guard isPrefix else { return value.utf8.elementsEqual(text.utf8) }
        guard value.utf8.starts(with: text.utf8) else { return false }
        // One scan of the part after the prefix, without splitting it: each segment (between
        // slashes, or an end) is refused when it is `.` or `..`; a backslash anywhere is refused.
        var segmentLength = 0
        var segmentIsDots = true
        var rest = value.utf8.dropFirst(text.utf8.count)[...]
        while var byte = rest.popFirst() {
            if byte == UInt8(ascii: "%") {
                guard let high = rest.popFirst()?.hexDigitValue,
                    let low = rest.popFirst()?.hexDigitValue
                else { return false }
                byte = high << 4 | low
                if byte == UInt8(ascii: "%") { return false }
            }
            switch byte {
            case UInt8(ascii: "\\"):
                return false
            case UInt8(ascii: "/"):
                if segmentIsDots, segmentLength == 1 || segmentLength == 2 { return false }
                segmentLength = 0
                segmentIsDots = true
            default:
                segmentLength += 1
                segmentIsDots = segmentIsDots && byte == UInt8(ascii: ".")
            }
        }
        return !(segmentIsDots && (segmentLength == 1 || segmentLength == 2))
    }

    /// As written in the configuration.
    public var description: String { isPrefix ? text + "*" : text }
}
