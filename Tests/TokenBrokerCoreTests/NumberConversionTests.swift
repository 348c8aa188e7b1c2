import Foundation
import Testing
import TokenBrokerCore

/// Numbers anyone may write (JSON doubles, issuers' claims) become integers only through checked
/// conversions: out of range is an error or nil, never a trap.
@Suite struct NumberConversionTests {
    @Test(arguments: [
        "1e19", "99999999999999999999", "1e300", "-1e19", "-1e300", "200.5", "9223372036854775807", "\"401\"",
    ])
    func retryOnValuesThatAreNoStatusCodeNameTheirKey(_ value: String) {
        let json = #"{"proxies": [{"name": "p", "target": "http://127.0.0.1:1", "retryOn": [401, "# + value + "]}]}"
        #expect(configurationProblem(json) == "proxies[0].retryOn[1]: must be an HTTP status code, 100–599")
    }

    @Test(arguments: [
        "1e19", "99999999999999999999", "1e300", "-1e19", "-1e300", "9223372036854775807", "-9223372036854775808",
    ])
    func hugeWholeNumbersAreOutOfRangeNotATrap(_ value: String) {
        let message = configurationProblem(#"{"providers": [{"maxRetryCount": "# + value + "}]}")
        #expect(message?.hasPrefix("providers[0].maxRetryCount: ") == true)
        #expect(message?.hasSuffix("0–10") == true, "\(message ?? "")")
    }

    @Test func exactIntTakesOnlyWholeNumbersThatFit() {
        #expect(JSONValue.number(42).exactInt == 42)
        #expect(JSONValue.number(-0.0).exactInt == 0)
        #expect(JSONValue.number(-7).exactInt == -7)
        // 0x1p63 is 2^63, the first Double past Int64.max (which a Double cannot hold exactly).
        for bad: JSONValue in [
            .number(1.5), .number(1e19), .number(-1e19), .number(1e300), .number(0x1p63),
            .string("3"), .null,
        ] {
            #expect(bad.exactInt == nil, "\(bad)")
        }
    }

    /// RFC 6749 writes `expires_in` as `1*DIGIT`: the parser says which numbers were written so,
    /// whatever their values (`300.0` and `3e2` are whole).
    @Test(arguments: [
        ("300", true), ("0", true), ("31536000", true), ("300.0", false), ("3e2", false), ("3.0e2", false),
        ("3E+2", false), ("30000e-2", false), ("-300", false), ("-0", false), ("300.5", false),
    ])
    func theParserMarksNumbersWrittenAsDigitsAlone(_ text: String, _ isDigits: Bool) throws {
        let value = try JSONValue(parsing: Array(text.utf8))
        guard case .number(let number) = value else {
            Issue.record("\(text) parsed as \(value.typeName)")
            return
        }
        #expect(number.isDigits == isDigits, "\(text)")
        #expect(value == .number(JSONNumber(Double(text)!)), "equal by value")
    }

    @Test func roundingConversionsAnswerNilInsteadOfTrapping() {
        #expect(Int64(rounding: 2.7, .down) == 2)
        #expect(Int64(rounding: -2.2, .down) == -3)
        #expect(Int(rounding: 2.2, .up) == 3)
        for bad in [1e19, -1e19, 1e300, -1e300, Double.infinity, -Double.infinity, Double.nan, 9.3e18] {
            #expect(Int64(rounding: bad, .down) == nil, "\(bad)")
            #expect(Int32(rounding: bad, .towardZero) == nil, "\(bad)")
        }
        #expect(Int32(rounding: 3e9, .down) == nil)
    }

    @Test func durationsFromSecondsAreChecked() {
        #expect(Duration.checkedSeconds(1.5) == .milliseconds(1500))
        #expect(Duration.checkedSeconds(-2) == .seconds(-2))
        #expect(Duration.checkedSeconds(31_536_000) == .seconds(31_536_000))
        for bad in [1e16, -1e16, 1e300, -1e300, Double.infinity, Double.nan, 9.3e15] {
            #expect(Duration.checkedSeconds(bad) == nil, "\(bad)")
        }
    }

    @Test func secondsRoundUpSoThatAnyTimeLeftIsAtLeastOne() {
        #expect(Duration.milliseconds(300).secondsRoundedUp == 1)
        #expect(Duration.seconds(5).secondsRoundedUp == 5)
        #expect((Duration.seconds(5) + .nanoseconds(1)).secondsRoundedUp == 6)
        #expect(Duration.zero.secondsRoundedUp == 0)
        #expect(Duration.milliseconds(-300).secondsRoundedUp == 0)
        #expect((Duration.seconds(Int64.max) + .milliseconds(500)).secondsRoundedUp == Int64.max)
    }

    /// Instants RFC 3339 cannot write (an issuer's `exp` of 1e16 or -1e300) read as the nearest
    /// end of its range: checked against Foundation's formatter at both ends.
    @Test(arguments: [1e16, 1e300, Double.infinity, 253_402_300_800.0])
    func rfc3339WritesInstantsAfterYear9999AsItsLastSecond(_ seconds: Double) {
        #expect(RFC3339.string(from: WallTime(timeIntervalSince1970: seconds)) == "9999-12-31T23:59:59Z")
    }

    @Test(arguments: [-1e19, -1e300, -Double.infinity, Double.nan, -62_167_219_201.0])
    func rfc3339WritesInstantsBeforeYear0AsItsFirstSecond(_ seconds: Double) {
        #expect(RFC3339.string(from: WallTime(timeIntervalSince1970: seconds)) == "0000-01-01T00:00:00Z")
    }

    @Test func rfc3339sWritableRangeMatchesFoundation() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = TimeZone(identifier: "UTC")
        let last = RFC3339.writableSeconds.upperBound
        #expect(formatter.string(from: Date(timeIntervalSince1970: Double(last))) == "9999-12-31T23:59:59Z")
        #expect(RFC3339.string(from: WallTime(timeIntervalSince1970: Double(last))) == "9999-12-31T23:59:59Z")
        #expect(WallTime(timeIntervalSince1970: 1e16).wholeSecondsSince1970 == nil)
        #expect(WallTime(timeIntervalSince1970: 1_800_000_000.9).wholeSecondsSince1970 == 1_800_000_000)
    }

    @Test func httpDateFieldsAreDigitsOnly() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") != nil)
        for bad in [
            "Sun, +6 Nov 1994 08:49:37 GMT", "Sun, 06 Nov +994 08:49:37 GMT", "Sun, 06 Nov 1994 -1:49:37 GMT",
            "Sun, 06 Nov 1994 08:+9:37 GMT", "Sun, 06 Nov 1994 08:49:-7 GMT",
        ] {
            #expect(HTTPDate.parse(bad) == nil, "\(bad)")
        }
    }

    @Test func jsonPointerIndexesAreDigitsWithoutSignOrLeadingZero() throws {
        let document = try JSONValue(parsing: Array(#"{"a": [10, 11]}"#.utf8))
        #expect(document.value(atPointer: "/a/1") == .number(11))
        for bad in ["/a/+1", "/a/01", "/a/-0", "/a/ 1", "/a/99999999999999999999"] {
            #expect(document.value(atPointer: bad) == nil, "\(bad)")
        }
    }
}
