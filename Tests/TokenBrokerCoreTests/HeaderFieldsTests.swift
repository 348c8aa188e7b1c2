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

    @Test func durationsConvertWithoutTrapping() {
        #expect(Duration.milliseconds(1500).wholeMilliseconds == 1500)
        #expect(Duration.microseconds(1999).wholeMilliseconds == 1)
        #expect(Duration.seconds(Int64.max).wholeMilliseconds == .max)
        #expect(Duration.seconds(Int64.min).wholeMilliseconds == .min)
        #expect(Duration.milliseconds(250).inSeconds == 0.25)
    }
}
