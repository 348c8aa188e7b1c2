/// A parsed JSON document, kept as a tree so that readers can walk it key by key.
///
/// The configuration reader uses it to report unknown keys with their full path.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses UTF-8 JSON text (`JSONParser`).
    public init(parsing data: some Collection<UInt8>) throws(JSONParseError) {
        var parser = JSONParser(data)
        self = try parser.parseDocument()
    }

    /// A short name of the value's JSON type, for error messages.
    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    /// The number as an `Int`, when it is one exactly: whole and in range; nil for anything else
    /// (`1.5`, `1e19`, `-1e300`, a string). Never traps, whatever the document holds.
    public var exactInt: Int? {
        guard case .number(let number) = self else { return nil }
        return Int(exactly: number.value)
    }

    /// The value at a JSON Pointer (RFC 6901), or nil when the pointer leads nowhere.
    public func value(atPointer pointer: String) -> JSONValue? {
        if pointer.isEmpty { return self }
        guard pointer.hasPrefix("/") else { return nil }
        var current = self
        for rawToken in pointer.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let token = Self.unescapePointerToken(rawToken)
            switch current {
            case .object(let members):
                guard let next = members[token] else { return nil }
                current = next
            case .array(let items):
                guard let index = Self.arrayIndex(token), items.indices.contains(index) else { return nil }
                current = items[index]
            default:
                return nil
            }
        }
        return current
    }

    /// An array index as RFC 6901 writes it: `0`, or digits without a leading zero (no sign).
    private static func arrayIndex(_ token: String) -> Int? {
        guard !token.isEmpty, token.utf8.count <= 18, token.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
            token == "0" || !token.hasPrefix("0")
        else { return nil }
        return Int(token)
    }

    /// Undoes RFC 6901's escapes: `~1` is `/`, `~0` is `~`.
    private static func unescapePointerToken(_ token: Substring) -> String {
        var out = ""
        var iterator = token.makeIterator()
        while let character = iterator.next() {
            guard character == "~" else {
                out.append(character)
                continue
            }
            switch iterator.next() {
            case "1": out.append("/")
            case "0": out.append("~")
            case let other?:
                out.append("~")
                out.append(other)
            case nil: out.append("~")
            }
        }
        return out
    }
}

/// A JSON number: its value, and whether its text was digits alone.
///
/// The value is all most readers want; the text's form matters where a protocol writes a number
/// as `1*DIGIT` (RFC 6749's `expires_in`), which `300.0` and `3e2` are not, though their values
/// are whole. Two numbers are equal when their values are.
public struct JSONNumber: Sendable, Equatable, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral {
    public let value: Double
    /// Whether the number was written as ASCII digits alone: `300`, `0300`; not `-5`, `300.0` or
    /// `3e2`. True for a number made in code from an integer literal.
    public let isDigits: Bool

    public init(_ value: Double, isDigits: Bool = false) {
        self.value = value
        self.isDigits = isDigits
    }

    public init(integerLiteral value: Int) { self.init(Double(value), isDigits: value >= 0) }
    public init(floatLiteral value: Double) { self.init(value) }

    public static func == (a: JSONNumber, b: JSONNumber) -> Bool { a.value == b.value }
}

/// Writes JSON text by hand, for bodies whose field order and shape are fixed.
public enum JSONText {
    /// `value` as a JSON string literal, quotes included (RFC 8259 §7).
    public static func quoted(_ value: String) -> String {
        var out = "\""
        out.reserveCapacity(value.utf8.count + 2)
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            // Also DEL and the C1 controls (U+0080–U+009F, such as U+009B, a terminal's CSI), which
            // JSON lets through but which must not reach a terminal that shows a log or an answer.
            case _
            where scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028
                || scalar.value == 0x2029:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default:
                out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
        return out
    }

    /// An object from already-encoded member values, in the given order.
    public static func object(_ members: [(String, String)]) -> String {
        "{" + members.map { quoted($0.0) + ":" + $0.1 }.joined(separator: ",") + "}"
    }

    /// The standard error body: `{"error": "...", "error_description": "..."}` (RFC 6749 §5.2).
    public static func errorBody(_ error: String, _ description: String) -> String {
        object([("error", quoted(error)), ("error_description", quoted(description))])
    }
}
