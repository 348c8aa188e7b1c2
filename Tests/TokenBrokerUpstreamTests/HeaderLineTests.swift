import Testing

@testable import TokenBrokerUpstream

/// The lines of an answer's head, as libcurl hands them to the header callback.
@Suite struct HeaderLineTests {
    private func read(_ text: String) -> HeaderLine? {
        Array(text.utf8).withUnsafeBytes { HeaderLine($0) }
    }

    @Test func statusLinesAndTheEmptyLineAreTold() {
        #expect(read("HTTP/1.1 200 OK\r\n") == .statusLine)
        #expect(read("HTTP/2 404\r\n") == .statusLine)
        #expect(read("\r\n") == .end)
        #expect(read("\n") == .end)
    }

    @Test func aFieldKeepsItsNameAsSentAndLosesTheBlanksAroundItsValue() {
        #expect(read("Content-Type: text/plain\r\n") == .field("Content-Type", "text/plain"))
        #expect(read("X-Spaced:  \t a b \t \r\n") == .field("X-Spaced", "a b"))
        #expect(read("X-Empty:\r\n") == .field("X-Empty", ""))
        #expect(read("X-Colons: a:b:c\r\n") == .field("X-Colons", "a:b:c"))
        #expect(read("X-No-Line-End: v") == .field("X-No-Line-End", "v"))
    }

    @Test func aLineWithoutAColonIsNoField() {
        #expect(read(" folded continuation\r\n") == nil)
        #expect(read("garbage\r\n") == nil)
    }

    @Test func bytesThatAreNotUTF8AreReplacedNotTrusted() {
        let line: [UInt8] = Array("X-Bin: ".utf8) + [0xFF, 0xFE] + Array("\r\n".utf8)
        let read = line.withUnsafeBytes { HeaderLine($0) }
        #expect(read == .field("X-Bin", "\u{FFFD}\u{FFFD}"))
    }
}
