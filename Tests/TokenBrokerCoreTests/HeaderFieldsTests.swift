import Testing
import TokenBrokerCore

/// Header names compared as HTTP compares them, and durations converted without trapping.
@Suite struct HeaderFieldsTests {
    @Test func namesMatchWithoutRegardToASCIICaseOnly() {
        #expect("Content-Type".equalsIgnoringASCIICase("content-TYPE"))
        #expect(!"Content-Type".equalsIgnoringASCIICase("Content-Typ"))
        #expect(!"Content-Typ".equalsIgnoringASCIICase("Content-Type"))
        // Only ASCII letters fold: "[" (0x5B) is not "{" (0x7B), and "K" is not KELVIN SIGN.
        #expect(!"[".equalsIgnoringASCIICase("{"))
        #expect(!"K".equalsIgnoringASCIICase("\u{212A}"))
        #expect("".equalsIgnoringASCIICase(""))
    }

    @Test func aBytePrefixIsComparedByteForByte() {
        #expect("/computeMetadata/v1/x".hasBytePrefix("/computeMetadata/"))
        #expect("/computeMetadata/".hasBytePrefix("/computeMetadata/"))
        #expect(!"/computeMetadata".hasBytePrefix("/computeMetadata/"))
        #expect(!"/computemetadata/v1".hasBytePrefix("/computeMetadata/"))
        #expect("anything".hasBytePrefix(""))
        #expect(!"".hasBytePrefix("/"))
        // Bytes, not characters: a combining mark after the prefix leaves its bytes a prefix.
        #expect("/a\u{301}".hasBytePrefix("/a"))
        #expect(!"/a\u{301}".hasPrefix("/a"))
        #expect("é/x".hasBytePrefix("é"))
        // Small strings (stored inline) and long ones (on the heap) alike.
        let long = String(repeating: "/segment", count: 40)
        #expect(long.hasBytePrefix(String(repeating: "/segment", count: 39) + "/seg"))
        #expect(!long.hasBytePrefix(String(repeating: "/segment", count: 39) + "/Seg"))
        #expect(!"/seg".hasBytePrefix(long))
    }

    @Test func listLookupsFindRemoveAndKeepOrder() {
        var fields = [("Accept", "a"), ("ACCEPT", "b"), ("Cookie", "c")]
        #expect(fields.value(named: "accept") == "a")
        #expect(fields.contains(named: "COOKIE"))
        #expect(fields.value(named: "Host") == nil)
        fields.removeAll(named: "accept")
        #expect(fields.map(\.0) == ["Cookie"])
    }

    @Test func blanksAreTrimmedFromBothEndsOfTheBoundsOnly() {
        let bytes = Array(" \t a \tb\t ".utf8)
        #expect(Array(bytes.trimmingHTTPBlanks()) == Array("a \tb".utf8), "spaces and tabs, not those inside")
        #expect(bytes.trimmingHTTPBlanks(0..<bytes.count) == 3..<7)
        // Within bounds: nothing outside them is looked at or kept.
        #expect(bytes.trimmingHTTPBlanks(4..<6) == 6..<6, "a blank-only range is empty")
        #expect(bytes.trimmingHTTPBlanks(3..<4) == 3..<4)
        #expect(bytes.trimmingHTTPBlanks(5..<5) == 5..<5)
        // Only SP and HTAB are blanks (RFC 9110 §5.6.3): CR, LF, VT and NBSP stay.
        let other = Array("\r\u{0B}x\n".utf8) + [0xA0]
        #expect(Array(other.trimmingHTTPBlanks()) == other)
        // A slice keeps its indices: a list element split off a header value.
        let element = Array("1, 2 ,3".utf8).split(separator: UInt8(ascii: ","))[1]
        #expect(Array(element.trimmingHTTPBlanks()) == [UInt8(ascii: "2")])
        #expect(element.trimmingHTTPBlanks().startIndex == 3)
        #expect(Array("".utf8).trimmingHTTPBlanks().isEmpty && Array("  ".utf8).trimmingHTTPBlanks().isEmpty)
    }

    @Test func durationsConvertWithoutTrapping() {
        #expect(Duration.milliseconds(1500).wholeMilliseconds == 1500)
        #expect(Duration.microseconds(1999).wholeMilliseconds == 1)
        #expect(Duration.seconds(Int64.max).wholeMilliseconds == .max)
        #expect(Duration.seconds(Int64.min).wholeMilliseconds == .min)
        #expect(Duration.milliseconds(250).inSeconds == 0.25)
    }
}
