import Foundation
import Testing
import TokenBrokerCore

@Suite struct TextFormatTests {
    @Test(arguments: [
        (0.0, "1970-01-01T00:00:00Z"), (951_782_400, "2000-02-29T00:00:00Z"),
        (1_795_995_358.9, "2026-11-29T23:35:58Z"), (4_102_444_799, "2099-12-31T23:59:59Z"),
    ])
    func rfc3339MatchesKnownInstants(_ seconds: Double, _ expected: String) {
        #expect(RFC3339.string(from: WallTime(timeIntervalSince1970: seconds)) == expected)
    }

    @Test func rfc3339AgreesWithFoundationsFormatterOverManyDays() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = TimeZone(identifier: "UTC")
        for day in stride(from: -1000, through: 40_000, by: 37) {
            let date = Date(timeIntervalSince1970: Double(day) * 86_400 + 12_345)
            #expect(
                RFC3339.string(from: WallTime(timeIntervalSince1970: date.timeIntervalSince1970))
                    == formatter.string(from: date))
        }
    }

    /// HTTP dates (IMF-fixdate) read back the instants Foundation's formatter wrote.
    @Test func httpDatesAgreeWithFoundationsFormatterOverManyDays() {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        for day in stride(from: -1000, through: 40_000, by: 41) {
            let seconds = Double(day) * 86_400 + 45_296
            let text = formatter.string(from: Date(timeIntervalSince1970: seconds))
            #expect(HTTPDate.parse(text) == WallTime(timeIntervalSince1970: seconds), "\(text)")
        }
        for bad in [
            "Sun, 06 Nov 1994 08:49:37 UTC", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
            "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Foo 1994 08:49:37 GMT", "120",
        ] {
            #expect(HTTPDate.parse(bad) == nil, "\(bad)")
        }
    }

    /// The broker's JSON parser against Foundation's, as an independent reader of the same texts.
    @Test(arguments: [
        #"{"a": [1, -2.5, 3e2, 0.125E-1, true, false, null], "b": {"c": "d\u00e9\ud83d\ude42\n\"\\\/"}, "": []}"#,
        #"[]"#, #"{}"#, #"  "x"  "#, #"[[[[[]]]]]"#, #"-0"#, #"1.7976931348623157e308"#, #"{"k": "\u2028 tab\t"}"#,
    ])
    func theJSONParserReadsWhatFoundationReads(_ text: String) throws {
        let ours = try JSONValue(parsing: Array(text.utf8))
        let theirs = try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
        #expect(ours == Self.value(theirs))
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\" 1}", "{\"a\": 1,}", "01", "1.", ".5", "+1", "1e", "tru", "nul", "\"\u{01}\"",
        "\"\\x\"", "\"\\ud800\"", "[1] 2", "{\"a\": 1, \"a\": 2}", "1e400", String(repeating: "[", count: 300),
    ])
    func theJSONParserRefusesWhatIsNotJSON(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSONValue(parsing: Array(text.utf8)) }
    }

    private static func value(_ object: Any) -> JSONValue {
        switch object {
        case is NSNull: return .null
        case let number as NSNumber where String(cString: number.objCType) == "c": return .bool(number.boolValue)
        case let number as NSNumber: return .number(number.doubleValue)
        case let text as String: return .string(text)
        case let items as [Any]: return .array(items.map(value))
        case let members as [String: Any]: return .object(members.mapValues(value))
        default: return .null
        }
    }

    @Test func jsonStringsEscapeWhatJSONRequires() throws {
        let tricky = "quote\" backslash\\ newline\n tab\t bell\u{07} unicode é 🙂 \u{2028}"
        let encoded = JSONText.quoted(tricky)
        let decoded = try JSONDecoder().decode(String.self, from: Data(encoded.utf8))
        #expect(decoded == tricky)
    }

    @Test func jsonStringsEscapeDELAndTheC1ControlsThatATerminalObeys() throws {
        // U+009B is a terminal's CSI on its own; the log and every JSON answer go through here.
        let tricky = "a\u{7F}b\u{80}c\u{9B}31md\u{9F}e\u{A0}f"
        let encoded = JSONText.quoted(tricky)
        #expect(encoded == #""a\u007fb\u0080c\u009b31md\u009fe"# + "\u{A0}f\"", "U+00A0 is no control: kept")
        #expect(try JSONDecoder().decode(String.self, from: Data(encoded.utf8)) == tricky)
    }

    @Test func jsonPointersFollowRFC6901() throws {
        let document = try JSONValue(parsing: Array(#"{"a": {"b/c": [10, {"~d": "x"}]}}"#.utf8))
        #expect(document.value(atPointer: "/a/b~1c/1/~0d") == .string("x"))
        #expect(document.value(atPointer: "/a/b~1c/0") == .number(10))
        #expect(document.value(atPointer: "/a/missing") == nil)
        #expect(document.value(atPointer: "") == document)
    }

    /// The byte-wise search finds what the standard library's own search finds, at the same
    /// place, over every ASCII needle of up to 3 letters from a small alphabet in many texts.
    @Test func byteSearchAgreesWithTheStandardLibrarysSearch() {
        let alphabet = ["a", "b", "%", "2", "f"]
        var needles = alphabet
        for first in alphabet {
            for second in alphabet {
                needles.append(first + second)
                for third in ["a", "%", "f"] { needles.append(first + second + third) }
            }
        }
        let texts = [
            "", "a", "ab%2fba", "%2f%2F%2f", "aaab", "ffff2", "b%a%2%2fa", "ba",
            String(repeating: "ab%", count: 20) + "2f", "x/é/%2f/ü",
        ]
        var checked = 0
        for text in texts {
            for needle in needles {
                let mine = text.firstRange(ofBytes: needle)
                let theirs = text.firstRange(of: needle)
                #expect(mine == theirs, "\(needle) in \(text)")
                #expect(text.contains(bytes: needle) == text.contains(needle))
                let sub = text.dropFirst(min(2, text.count))
                #expect(
                    sub.firstRange(ofBytes: needle) == sub.firstRange(of: needle), "\(needle) in the rest of \(text)")
                checked += 1
            }
        }
        #expect(checked == texts.count * needles.count)
        #expect("abc".firstRange(ofBytes: "") == "abc".startIndex..<"abc".startIndex)
    }
}
