import Foundation
import Testing
import TokenBrokerCore

@testable import token_broker

@Suite struct LogTests {
    @Test func aLineHasTheTimeTheLevelTheMessageAndTheFieldsInOrder() {
        let line = Log.line(
            "info", "token fetched", ["provider": "default", "version": "1", "took_ms": "0"],
            at: WallTime(timeIntervalSince1970: 1_800_000_000))
        #expect(
            line == "time=2027-01-15T08:00:00Z level=info msg=\"token fetched\" provider=default version=1 took_ms=0\n")
    }

    @Test(arguments: ["default", "sha256:1a2b3c4d5e6f", "/etc/token-broker/key.pem", "[::1]:8080", "0644"])
    func printableValuesWithoutSpaceQuoteOrEqualsStayBare(_ value: String) {
        #expect(Log.quote(value) == value)
    }

    @Test(arguments: [
        "", "two words", "a=b", "say \"hi\"", "line\nforged=1", "tab\there", "\r", "caf\u{E9}", "\u{7F}",
        "back\\slash and space",
    ])
    func anythingElseIsAJSONStringThatReadsBackTheSame(_ value: String) throws {
        let quoted = Log.quote(value)
        #expect(quoted.hasPrefix("\"") && quoted.hasSuffix("\""))
        #expect(!quoted.contains("\n") && !quoted.contains("\r"), "a value cannot start a new line")
        // Foundation's JSON reader, not the broker's writer, says what the quoted text means.
        let read = try JSONSerialization.jsonObject(with: Data("[\(quoted)]".utf8)) as? [String]
        #expect(read == [value])
    }

    @Test func aForgedFieldInAValueStaysInsideIt() {
        let line = Log.line(
            "warn", "m", ["problem": "x level=error msg=forged"], at: WallTime(timeIntervalSince1970: 0))
        #expect(line == "time=1970-01-01T00:00:00Z level=warn msg=m problem=\"x level=error msg=forged\"\n")
    }
}

/// `"logFormat": "json"`: one JSON object a line, read back here by Foundation's reader.
@Suite struct JSONLogTests {
    private func object(_ line: String) throws -> [String: String] {
        #expect(line.hasSuffix("}\n") && line.filter { $0 == "\n" }.count == 1, "one line: \(line)")
        return try #require(JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String])
    }

    @Test func aLineIsOneObjectWithTheTimeTheLevelTheMessageAndTheFields() throws {
        let line = Log.line(
            "info", "token fetched", ["provider": "default", "version": "1", "token": "sha256:1a2b3c4d5e6f"],
            at: WallTime(timeIntervalSince1970: 1_800_000_000), format: .json)
        #expect(
            line
                == "{\"time\":\"2027-01-15T08:00:00Z\",\"level\":\"info\",\"msg\":\"token fetched\",\"provider\":\"default\",\"version\":\"1\",\"token\":\"sha256:1a2b3c4d5e6f\"}\n"
        )
        let read = try object(line)
        #expect(read["msg"] == "token fetched" && read["level"] == "info" && read["token"] == "sha256:1a2b3c4d5e6f")
    }

    @Test(arguments: ["line\nforged=1", "say \"hi\"", "back\\slash", "\u{0}\u{1F}\u{7F}", "caf\u{E9} \u{1F600}", ""])
    func valuesAndKeysOfAnyTextReadBackTheSameAndStayOnTheirLine(_ text: String) throws {
        let line = Log.line(
            "warn", text, [text.isEmpty ? "empty" : "k" + text: text], at: WallTime(timeIntervalSince1970: 0),
            format: .json)
        let read = try object(line)
        #expect(read["msg"] == text)
        #expect(read[text.isEmpty ? "empty" : "k" + text] == text)
    }

    @Test func aForgedKeyInAValueStaysInsideIt() throws {
        let read = try object(
            Log.line(
                "warn", "m", ["problem": "x\",\"level\":\"error"], at: WallTime(timeIntervalSince1970: 0),
                format: .json))
        #expect(read["level"] == "warn")
        #expect(read["problem"] == "x\",\"level\":\"error")
    }
}
