/// Reads one JSON object of the configuration, key by key, and refuses keys nobody asked for.
///
/// Every accessor records the key it reads; `finish()` then names any key left over, with the
/// keys that are allowed, so a typo such as `maxRetryCont` fails loudly instead of being ignored.
struct ObjectReader {
    let path: String
    private let members: [String: JSONValue]
    private var known: [String] = []

    init(_ value: JSONValue, path: String) throws(ConfigurationError) {
        guard case .object(let members) = value else {
            throw ConfigurationError(key: path, "must be an object, not \(value.typeName)")
        }
        self.members = members
        self.path = path
    }

    /// A reader for a whole JSON file, which must hold one object.
    init(parsingFile json: some Collection<UInt8>) throws(ConfigurationError) {
        let document: JSONValue
        do {
            document = try JSONValue(parsing: json)
        } catch {
            throw ConfigurationError(key: "", "the file is not valid JSON (\(error))")
        }
        try self.init(document, path: "")
    }

    func keyPath(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// The value of `key`; nil when the key is not there. `null` is an error naming the key, as
    /// an unknown key is: taken as "not set", it silently gave the default, which for some keys
    /// turns a protection off (`"clientKeysFile": null`: no caller keys) or runs something else
    /// than meant (`"store": null`: the memory store; `"providers": null`: the default signer).
    /// Leaving the key out is how a default is asked for.
    mutating func raw(_ key: String) throws(ConfigurationError) -> JSONValue? {
        known.append(key)
        guard let value = members[key] else { return nil }
        guard value != .null else {
            throw ConfigurationError(key: keyPath(key), "is null; leave the key out for its default, or give a value")
        }
        return value
    }

    mutating func string(_ key: String) throws(ConfigurationError) -> String? {
        guard let value = try raw(key) else { return nil }
        guard case .string(let text) = value else {
            throw ConfigurationError(key: keyPath(key), "must be a string, not \(value.typeName)")
        }
        return text
    }

    mutating func string(_ key: String, default fallback: String) throws(ConfigurationError) -> String {
        try string(key) ?? fallback
    }

    /// A string that must be one of `allowed`.
    mutating func choice(_ key: String, _ allowed: [String], default fallback: String) throws(ConfigurationError)
        -> String
    {
        let value = try string(key, default: fallback)
        guard allowed.contains(value) else {
            throw ConfigurationError(
                key: keyPath(key), "unknown value \"\(value)\"; allowed: \(allowed.joined(separator: ", "))")
        }
        return value
    }

    /// `choice` for an enum whose raw values are the allowed texts, listed in the order of its cases.
    mutating func choice<Value: RawRepresentable & CaseIterable>(
        _ key: String, default fallback: Value
    ) throws(ConfigurationError) -> Value where Value.RawValue == String {
        Value(rawValue: try choice(key, Value.allCases.map(\.rawValue), default: fallback.rawValue)) ?? fallback
    }

    mutating func bool(_ key: String, default fallback: Bool) throws(ConfigurationError) -> Bool {
        guard let value = try raw(key) else { return fallback }
        guard case .bool(let flag) = value else {
            throw ConfigurationError(key: keyPath(key), "must be true or false, not \(value.typeName)")
        }
        return flag
    }

    /// A whole number inside `range`.
    mutating func int(_ key: String, _ range: ClosedRange<Int>) throws(ConfigurationError) -> Int? {
        guard let value = try raw(key) else { return nil }
        return try Self.int(value, range, key: keyPath(key))
    }

    /// `value` as a whole number inside `range`, or an error naming `key`. Checked before it is
    /// converted (`JSONValue.exactInt`): `1e19`, `-1e300` and `1.5` are errors, never a trap.
    static func int(_ value: JSONValue, _ range: ClosedRange<Int>, key: String) throws(ConfigurationError) -> Int {
        guard case .number(let written) = value else {
            throw ConfigurationError(
                key: key, "must be a whole number in \(range.lowerBound)–\(range.upperBound), not \(value.typeName)")
        }
        let number = written.value
        guard number.rounded(.towardZero) == number else {
            throw ConfigurationError(
                key: key, "must be a whole number in \(range.lowerBound)–\(range.upperBound), not \(number)")
        }
        guard let whole = value.exactInt, range.contains(whole) else {
            let shown = value.exactInt.map { String($0) } ?? String(number)
            throw ConfigurationError(
                key: key, "\(shown) is out of range; allowed: \(range.lowerBound)–\(range.upperBound)")
        }
        return whole
    }

    mutating func int(_ key: String, _ range: ClosedRange<Int>, default fallback: Int) throws(ConfigurationError) -> Int
    {
        try int(key, range) ?? fallback
    }

    /// An array, handed over item by item with each item's path.
    mutating func array(_ key: String) throws(ConfigurationError) -> [(path: String, value: JSONValue)]? {
        guard let value = try raw(key) else { return nil }
        guard case .array(let items) = value else {
            throw ConfigurationError(key: keyPath(key), "must be an array, not \(value.typeName)")
        }
        return items.enumerated().map { ("\(keyPath(key))[\($0.offset)]", $0.element) }
    }

    /// A nested object.
    mutating func object(_ key: String) throws(ConfigurationError) -> ObjectReader? {
        guard let value = try raw(key) else { return nil }
        return try ObjectReader(value, path: keyPath(key))
    }

    /// Every member, all marked as read, in key order (for free-form maps such as headers); a
    /// `null` value is an error naming its key, as for `raw`.
    mutating func allMembers() throws(ConfigurationError) -> [(String, JSONValue)] {
        known.append(contentsOf: members.keys)
        let keys = members.keys.sorted()
        if let key = keys.first(where: { members[$0] == .null }) { _ = try raw(key) }
        return keys.map { ($0, members[$0]!) }
    }

    /// Every member as a string, in key order; fails on a value that is not a string.
    mutating func stringMembers() throws(ConfigurationError) -> [(String, String)] {
        var out: [(String, String)] = []
        for (key, value) in try allMembers() {
            guard case .string(let text) = value else {
                throw ConfigurationError(key: keyPath(key), "must be a string, not \(value.typeName)")
            }
            out.append((key, text))
        }
        return out
    }

    /// Takes `key` off the keys allowed, for a reader that refused it after a shared accessor
    /// read it (a proxy's `maxResponseBytes`, which `UpstreamConfiguration` reads for sources).
    mutating func disallow(_ key: String) {
        known.removeAll { $0 == key }
    }

    /// Fails on the first key that no accessor read, naming each allowed key once, in the order read.
    func finish() throws(ConfigurationError) {
        if let unknown = members.keys.sorted().first(where: { !known.contains($0) }) {
            var allowed: [String] = []
            for key in known where !allowed.contains(key) { allowed.append(key) }
            throw ConfigurationError(
                key: keyPath(unknown), "unknown key; allowed: \(allowed.joined(separator: ", "))")
        }
    }
}
