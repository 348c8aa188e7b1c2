import Foundation
import Testing
import TokenBrokerCore

@Suite struct TextFormatTests {
    @Test(arguments: [
        (0.0, "1970-01-01T00:00:00Z"), (951_782_400, "2000-02-29T00:00:00Z"),
        (1_795_995_358.9, "2026-11-29T23:35:58Z"), (4_102_444_799, "2099-12-31T23:59:59Z"),
    ])
    func rfc3339MatchesKnownInstants(_ seconds: Double, _ expected: String) {
        #expect(RFC3339.string(from: Date(timeIntervalSince1970: seconds)) == expected)
    }

    @Test func rfc3339AgreesWithFoundationsFormatterOverManyDays() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = TimeZone(identifier: "UTC")
        for day in stride(from: -1000, through: 40_000, by: 37) {
            let date = Date(timeIntervalSince1970: Double(day) * 86_400 + 12_345)
            #expect(RFC3339.string(from: date) == formatter.string(from: date))
        }
    }

    @Test func jsonStringsEscapeWhatJSONRequires() throws {
        let tricky = "quote\" backslash\\ newline\n tab\t bell\u{07} unicode é 🙂 \u{2028}"
        let encoded = JSONText.quoted(tricky)
        let decoded = try JSONDecoder().decode(String.self, from: Data(encoded.utf8))
        #expect(decoded == tricky)
    }

    @Test func jsonPointersFollowRFC6901() throws {
        let document = try JSONValue(parsing: Array(#"{"a": {"b/c": [10, {"~d": "x"}]}}"#.utf8))
        #expect(document.value(atPointer: "/a/b~1c/1/~0d") == .string("x"))
        #expect(document.value(atPointer: "/a/b~1c/0") == .number(10))
        #expect(document.value(atPointer: "/a/missing") == nil)
        #expect(document.value(atPointer: "") == document)
    }
}
