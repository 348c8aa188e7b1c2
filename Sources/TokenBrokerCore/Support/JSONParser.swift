/// A strict RFC 8259 parser for `JSONValue`: UTF-8 in, a tree out, or an error with its byte offset.
///
/// The broker's own, so that it needs no Foundation (whose runtime costs a few MB of every
/// process's memory). Numbers become `Double`, marked when written as digits alone; an object may not repeat a key; nesting stops
/// at 256 levels.
struct JSONParser {
    private let bytes: [UInt8]
    private var index = 0
    private var depth = 0
    private static let maximumDepth = 256

    init(_ input: some Collection<UInt8>) { bytes = Array(input) }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        guard index == bytes.count else { throw problem("unexpected text after the value") }
        return value
    }

    private mutating func parseValue() throws(JSONParseError) -> JSONValue {
        guard index < bytes.count else { throw problem("unexpected end of the text") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expect("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expect("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expect("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default: throw problem("unexpected character")
        }
    }

    private mutating func parseObject() throws(JSONParseError) -> JSONValue {
        try enter()
        index += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if peek(UInt8(ascii: "}")) {
            index += 1
            depth -= 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard peek(UInt8(ascii: "\"")) else { throw problem("expected a key in quotes") }
            let key = try parseString()
            skipWhitespace()
            guard peek(UInt8(ascii: ":")) else { throw problem("expected ':' after a key") }
            index += 1
            skipWhitespace()
            guard members.updateValue(try parseValue(), forKey: key) == nil else {
                throw problem("the key \(JSONText.quoted(key)) appears twice")
            }
            skipWhitespace()
            if peek(UInt8(ascii: ",")) {
                index += 1
                continue
            }
            guard peek(UInt8(ascii: "}")) else { throw problem("expected ',' or '}'") }
            index += 1
            depth -= 1
            return .object(members)
        }
    }

    private mutating func parseArray() throws(JSONParseError) -> JSONValue {
        try enter()
        index += 1
        var items: [JSONValue] = []
        skipWhitespace()
        if peek(UInt8(ascii: "]")) {
            index += 1
            depth -= 1
            return .array(items)
        }
        while true {
            skipWhitespace()
            items.append(try parseValue())
            skipWhitespace()
            if peek(UInt8(ascii: ",")) {
                index += 1
                continue
            }
            guard peek(UInt8(ascii: "]")) else { throw problem("expected ',' or ']'") }
            index += 1
            depth -= 1
            return .array(items)
        }
    }

    private mutating func parseString() throws(JSONParseError) -> String {
        index += 1  // the opening quote
        var out: [UInt8] = []
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                guard let text = String(validating: out, as: UTF8.self) else {
                    throw problem("a string is not valid UTF-8")
                }
                return text
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { break }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escape)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"): out.append(contentsOf: try parseUnicodeEscape())
                default: throw problem("a string has an unknown escape")
                }
            case 0x00..<0x20:
                throw problem("a string holds a control character; escape it")
            default:
                out.append(byte)
                index += 1
            }
        }
        throw problem("a string is not closed")
    }

    /// `\uXXXX`, with a surrogate pair when the first is a high surrogate; returns UTF-8.
    private mutating func parseUnicodeEscape() throws(JSONParseError) -> [UInt8] {
        var scalar = try hex4()
        if (0xD800...0xDBFF).contains(scalar) {
            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
            else {
                throw problem("a lone surrogate in a \\u escape")
            }
            index += 2
            let low = try hex4()
            guard (0xDC00...0xDFFF).contains(low) else { throw problem("a lone surrogate in a \\u escape") }
            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
        } else if (0xDC00...0xDFFF).contains(scalar) {
            throw problem("a lone surrogate in a \\u escape")
        }
        guard let unicode = Unicode.Scalar(scalar) else { throw problem("a \\u escape is not a character") }
        return Array(String(Character(unicode)).utf8)
    }

    private mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw problem("a \\u escape needs four hex digits") }
        var value: UInt32 = 0
        for byte in bytes[index..<index + 4] {
            guard let digit = byte.hexDigitValue else { throw problem("a \\u escape needs four hex digits") }
            value = value << 4 | UInt32(digit)
        }
        index += 4
        return value
    }

    /// RFC 8259 §6: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`
    private mutating func parseNumber() throws(JSONParseError) -> JSONNumber {
        let start = index
        if peek(UInt8(ascii: "-")) { index += 1 }
        if peek(UInt8(ascii: "0")) {
            index += 1
        } else {
            guard digits() > 0 else { throw problem("a number needs digits") }
        }
        let sawFraction = peek(UInt8(ascii: "."))
        if sawFraction {
            index += 1
            guard digits() > 0 else { throw problem("a number needs digits after '.'") }
        }
        let mantissaEnd = index
        if peek(UInt8(ascii: "e")) || peek(UInt8(ascii: "E")) {
            index += 1
            if peek(UInt8(ascii: "+")) || peek(UInt8(ascii: "-")) { index += 1 }
            guard digits() > 0 else { throw problem("a number needs digits in its exponent") }
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        guard let number = Double(text), number.isFinite else { throw problem("a number is out of range") }
        // Below the smallest Double the other way too: `1e-400` would read as 0, and a setting
        // that takes whole numbers would take it for 0 while it refuses `0.5`.
        guard number != 0 || !bytes[start..<mantissaEnd].contains(where: { (0x31...0x39).contains($0) }) else {
            throw problem("a number is out of range")
        }
        return JSONNumber(number, isDigits: bytes[start] != UInt8(ascii: "-") && mantissaEnd == index && !sawFraction)
    }

    private mutating func digits() -> Int {
        let start = index
        while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        return index - start
    }

    private mutating func expect(_ word: String) throws(JSONParseError) {
        let expected = Array(word.utf8)
        guard index + expected.count <= bytes.count, Array(bytes[index..<index + expected.count]) == expected else {
            throw problem("unexpected character")
        }
        index += expected.count
    }

    private mutating func enter() throws(JSONParseError) {
        depth += 1
        guard depth <= Self.maximumDepth else { throw problem("nested deeper than \(Self.maximumDepth) levels") }
    }

    private func peek(_ byte: UInt8) -> Bool { index < bytes.count && bytes[index] == byte }

    private mutating func skipWhitespace() {
        while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
    }

    private func problem(_ message: String) -> JSONParseError { JSONParseError(message: message, offset: index) }
}

/// Why a text is not JSON, and where (a byte offset from 0).
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    public let offset: Int
    public var description: String { "\(message) at byte \(offset)" }
}
