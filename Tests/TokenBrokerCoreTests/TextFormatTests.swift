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

    /// HTTP dates (IMF-fixdate) read back the instants Foundation's formatter wrote; what is none
    /// of the three forms is refused.
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
            "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT", "120", "", "Sunday, 06 Nov 1994 08:49:37 GMT",
            // RFC 850 dates: a short weekday, another zone, a four-digit year, a missing part.
            "Sun, 06-Nov-94 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 UTC", "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 06-Nov 08:49:37 GMT", "Sunday, 6-Nov-94 08:49:37 GMT", "Sunday, 06-nov-94 08:49:37 GMT",
            // asctime dates: one space before a one-digit day, two before two digits, a two-digit year.
            "Sun Nov 6 08:49:37 1994", "Sun Nov  16 08:49:37 1994", "Sun Nov  6 08:49:37 94",
            "Sun, Nov  6 08:49:37 1994",
            "Sunday Nov  6 08:49:37 1994", "Sun Nov  6 08:49 1994", "Sun Nov 06 08:49:37 1994 GMT",
        ] {
            #expect(HTTPDate.parse(bad) == nil, "\(bad)")
        }
    }

    /// The three forms of RFC 9110 §5.6.7, as Python wrote them (email.utils.formatdate with
    /// usegmt, time.strftime("%A, %d-%b-%y %H:%M:%S GMT"), time.asctime), read back as the
    /// instants they were written from; the first is the RFC's own example. An RFC 850 date is
    /// read at the instant it names, so that its two-digit year falls in its own century.
    @Test(arguments: [
        (
            784_111_777, "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994"
        ),
        (0, "Thu, 01 Jan 1970 00:00:00 GMT", "Thursday, 01-Jan-70 00:00:00 GMT", "Thu Jan  1 00:00:00 1970"),
        (
            951_782_400, "Tue, 29 Feb 2000 00:00:00 GMT", "Tuesday, 29-Feb-00 00:00:00 GMT",
            "Tue Feb 29 00:00:00 2000"
        ),
        (
            951_868_799, "Tue, 29 Feb 2000 23:59:59 GMT", "Tuesday, 29-Feb-00 23:59:59 GMT",
            "Tue Feb 29 23:59:59 2000"
        ),
        (
            1_234_567_890, "Fri, 13 Feb 2009 23:31:30 GMT", "Friday, 13-Feb-09 23:31:30 GMT",
            "Fri Feb 13 23:31:30 2009"
        ),
        (
            1_709_211_661, "Thu, 29 Feb 2024 13:01:01 GMT", "Thursday, 29-Feb-24 13:01:01 GMT",
            "Thu Feb 29 13:01:01 2024"
        ),
        (
            1_795_995_358, "Sun, 29 Nov 2026 23:35:58 GMT", "Sunday, 29-Nov-26 23:35:58 GMT",
            "Sun Nov 29 23:35:58 2026"
        ),
        (
            4_102_444_799, "Thu, 31 Dec 2099 23:59:59 GMT", "Thursday, 31-Dec-99 23:59:59 GMT",
            "Thu Dec 31 23:59:59 2099"
        ),
    ])
    func httpDatesAreReadInEachOfTheirThreeForms(_ seconds: Double, _ imf: String, _ rfc850: String, _ asctime: String)
    {
        let instant = WallTime(timeIntervalSince1970: seconds)
        #expect(HTTPDate.parse(imf) == instant)
        #expect(HTTPDate.parse(rfc850, now: instant) == instant)
        #expect(HTTPDate.parse(asctime) == instant)
    }

    /// RFC 850's two-digit years, read on 2026-12-07 at 10:00 GMT: in this century, unless that
    /// is more than 50 years on, then in the last (RFC 9110 §5.6.7). Instants from Python's
    /// calendar.timegm.
    @Test(arguments: [
        ("Wednesday, 01-Jan-76 00:00:00 GMT", 3_345_062_400.0),  // 2076: 49 years on
        ("Monday, 07-Dec-76 00:00:00 GMT", 3_374_524_800),  // 2076: ten hours short of 50 years on
        ("Wednesday, 08-Dec-76 00:00:00 GMT", 218_851_200),  // 1976: 2076 would be more than 50 years on
        ("Saturday, 01-Jan-77 00:00:00 GMT", 220_924_800),  // 1977
        ("Sunday, 06-Nov-94 08:49:37 GMT", 784_111_777),  // 1994
        ("Saturday, 01-Jan-00 00:00:00 GMT", 946_684_800),  // 2000
        ("Monday, 07-Dec-26 00:00:00 GMT", 1_796_601_600),  // 2026: today
    ])
    func rfc850TwoDigitYearsMoreThanFiftyYearsOnAreInTheLastCentury(_ text: String, _ seconds: Double) {
        let now = WallTime(timeIntervalSince1970: 1_796_637_600)
        #expect(HTTPDate.parse(text, now: now) == WallTime(timeIntervalSince1970: seconds))
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
        case let number as NSNumber: return .number(JSONNumber(number.doubleValue))
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
