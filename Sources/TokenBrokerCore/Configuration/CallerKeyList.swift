/// The callers allowed to read tokens: `clientKeysFile`, parsed and checked.
///
/// The file holds no keys, only their SHA-256 hashes, each with the providers its caller may read:
///
/// ```json
/// {"keys": [{"name": "billing", "sha256": "<64 hex digits>", "providers": ["default", "payments"]}]}
/// ```
///
/// `"providers": ["*"]` allows every provider. A caller sends its key as `Authorization: Bearer <key>`.

public struct CallerKeyList: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        /// A label for logs and answers; never the key.
        public let name: String
        /// SHA-256 of the key, 32 bytes.
        public let digest: [UInt8]
        /// The providers this caller may read; nil for every provider.
        public let providers: Set<String>?

        public func mayRead(_ provider: String) -> Bool { providers?.contains(provider) ?? true }
    }

    public let entries: [Entry]

    /// Parses the file's JSON.
    /// - Parameter knownProviders: every configured provider's name; a name outside them is a typo.
    public init(json: some Collection<UInt8>, knownProviders: Set<String>) throws(ConfigurationError) {
        var reader = try ObjectReader(parsingFile: json)
        guard let items = try reader.array("keys") else { throw ConfigurationError(key: "keys", "is required") }
        try reader.finish()
        var entries: [Entry] = []
        var names: Set<String> = []
        var digests: Set<[UInt8]> = []
        for item in items {
            var entry = try ObjectReader(item.value, path: item.path)
            guard let name = try entry.string("name") else {
                throw ConfigurationError(
                    key: entry.keyPath("name"), "is required: 1–64 printable ASCII characters, no spaces or quotes")
            }
            guard !name.isEmpty, name.utf8.count <= 64,
                name.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != 0x22 && $0 != 0x5C })
            else {
                throw ConfigurationError(
                    key: entry.keyPath("name"),
                    "\(JSONText.quoted(name)) is not a caller name: 1–64 printable ASCII characters, no spaces or quotes"
                )
            }
            guard names.insert(name).inserted else {
                throw ConfigurationError(key: entry.keyPath("name"), "duplicate name \"\(name)\"")
            }
            guard let hex = try entry.string("sha256") else {
                throw ConfigurationError(
                    key: entry.keyPath("sha256"),
                    "is required: the key's SHA-256 as 64 hex digits (printf %s \"$KEY\" | sha256sum)")
            }
            // The value is not repeated: it may be the key itself, pasted by mistake.
            guard let digest = Self.bytes(hex: hex), digest.count == 32 else {
                throw ConfigurationError(
                    key: entry.keyPath("sha256"),
                    "is not a SHA-256: found \(hex.count) characters, need 64 hex digits (printf %s \"$KEY\" | sha256sum)"
                )
            }
            guard digests.insert(digest).inserted else {
                throw ConfigurationError(key: entry.keyPath("sha256"), "the same key is listed twice")
            }
            guard let providerItems = try entry.array("providers"), !providerItems.isEmpty else {
                throw ConfigurationError(
                    key: entry.keyPath("providers"),
                    "is required: the provider names this caller may read, or [\"*\"] for all")
            }
            var providers: Set<String>? = []
            for provider in providerItems {
                guard case .string(let providerName) = provider.value else {
                    throw ConfigurationError(key: provider.path, "must be a provider name")
                }
                if providerName == "*" {
                    providers = nil
                } else if knownProviders.contains(providerName) {
                    providers?.insert(providerName)
                } else {
                    throw ConfigurationError(
                        key: provider.path,
                        "no provider is named \"\(providerName)\"; allowed: \(knownProviders.sorted().joined(separator: ", ")), *"
                    )
                }
            }
            try entry.finish()
            entries.append(Entry(name: name, digest: digest, providers: providers))
        }
        self.entries = entries
    }

    private static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = digits[index].hexDigitValue, let low = digits[index + 1].hexDigitValue else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }
}

/// Who may read which provider: what the token routes ask before answering.
public protocol CallerAuthorizing: Sendable {
    /// - Parameters:
    ///   - authorization: the bytes of the request's `Authorization` header as sent, if any, read
    ///     in place (valid during the call only). Not decoded: a key is the bytes the caller sent
    ///     (HTTP lets a header carry bytes that are not UTF-8), never text repaired from them.
    ///   - provider: the provider the request reads.
    func authorize(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerDecision
}

/// The answer to "may this request read this provider?".
public enum CallerDecision: Sendable, Equatable {
    case allowed
    /// No `Authorization: Bearer` key was sent.
    case missingKey
    /// A key was sent and matches no listed caller.
    case unknownKey
    /// The key belongs to `caller`, who may not read this provider.
    case forbidden(caller: String)
}
