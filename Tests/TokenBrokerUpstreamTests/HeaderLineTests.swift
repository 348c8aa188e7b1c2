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
        #expect(read("Content-Type: text/plain\r\n") == .field("Content-Type", Array("text/plain".utf8)))
        #expect(read("X-Spaced:  \t a b \t \r\n") == .field("X-Spaced", Array("a b".utf8)))
        #expect(read("X-Empty:\r\n") == .field("X-Empty", []))
        #expect(read("X-Colons: a:b:c\r\n") == .field("X-Colons", Array("a:b:c".utf8)))
        #expect(read("X-No-Line-End: v") == .field("X-No-Line-End", Array("v".utf8)))
    }

    @Test func aLineWithoutAColonIsNoField() {
        #expect(read("garbage\r\n") == nil)
    }

    /// obs-fold (RFC 9112 §5.2): a line that starts with a blank continues the field before,
    /// whether or not it holds a colon; the blanks around it are the fold, replaced by one space.
    @Test func aLineThatStartsWithABlankIsAFoldedContinuation() {
        #expect(read(" folded continuation\r\n") == .continuation(Array("folded continuation".utf8)))
        #expect(read("\t  a: b \t\r\n") == .continuation(Array("a: b".utf8)))
        #expect(read(" \t\r\n") == .continuation([]))
    }

    /// obs-text (RFC 9110 §5.5): a proxied answer passes the value on as it came.
    @Test func aValueKeepsItsBytesWhetherOrNotTheyAreUTF8() {
        let line: [UInt8] = Array("X-Bin: caf".utf8) + [0xE9, 0x20, 0xFF, 0xFE, 0xC3, 0xA9] + Array("\r\n".utf8)
        let read = line.withUnsafeBytes { HeaderLine($0) }
        #expect(read == .field("X-Bin", Array("caf".utf8) + [0xE9, 0x20, 0xFF, 0xFE, 0xC3, 0xA9]))
    }
}
