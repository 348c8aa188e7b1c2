// The request target as the request-line callback sees it, before libmicrohttpd reads it:
// its length and what it may not hold (`RequestTarget.measure`), and the bound on its query's
// arguments and where libmicrohttpd reads them (`RequestTarget.cutQuery`).
import Testing

@testable import TokenBrokerServer

@Suite struct RequestTargetTests {
    @Test(arguments: [
        ("/token", 6),
        ("/token?x=%00", 12),  // a %00 in the query is the query's readers' to refuse
        ("/token%00.png", -1),
        ("/token /x", RequestTarget.spaceOrControl),
        ("/token?a= b", RequestTarget.spaceOrControl),
        ("/token\t/x", RequestTarget.spaceOrControl),
        ("/token?a=\u{7F}", RequestTarget.spaceOrControl),
        ("/token\u{1B}[0m", RequestTarget.spaceOrControl),
        ("/caf\u{E9}", 6),  // bytes above 127 pass, as in header values
    ])
    func aTargetIsMeasuredAndRefusedForWhatItMayNotHold(_ target: String, _ expected: Int) {
        let measured = target.withCString { RequestTarget.measure($0) }
        #expect(measured == expected, "\(target.debugDescription)")
    }

    /// `target` in a request line as libmicrohttpd leaves it for the request-line callback: the
    /// space after the method, the one before the version and the line's end (CRLF, or a bare LF
    /// with `crlf` false) overwritten with NULs. Calls `body` with the target and its length; returns
    /// what it returned, and the target's bytes after.
    static func inRequestLine<Result>(
        _ target: [UInt8], crlf: Bool = true,
        _ body: (UnsafeMutablePointer<CChar>, Int) -> Result
    ) -> (Result, line: [UInt8]) {
        let lineEnd: [UInt8] = crlf ? [0, 0] : [0]
        var line = Array("GET".utf8) + [0] + target + [0] + Array("HTTP/1.1".utf8) + lineEnd
        let result = line.withUnsafeMutableBytes { bytes in
            body((bytes.baseAddress! + 4).assumingMemoryBound(to: CChar.self), target.count)
        }
        return (result, Array(line[4..<(4 + target.count)]))
    }

    @Test(arguments: [
        ("/t?a=1&b=2", 2, RequestTarget.QueryCut.none, "/t?a=1&b=2"),
        ("/t?a=1&b=2&c=3", 2, .tooManyArguments, "/t?\0=1&b=2&c=3"),
        ("/t?a=1", 0, .tooManyArguments, "/t?\0=1"),
        ("/t?", 0, .none, "/t?"),
        ("/t", 0, .none, "/t"),
        ("/t&x&y?a", 1, .none, "/t&x&y?a"),  // an & in the path separates no arguments
        // libmicrohttpd reads arguments up to the first NUL after the `?`: here one.
        ("/t?a\0&b&c", 1, .none, "/t?a\0&b&c"),
        // A NUL sent raw before the `?`: libmicrohttpd still finds the `?`, and the head is refused.
        ("/tok\0en?a=1&b=2", 100, .behindNUL, "/tok\0en?\0=1&b=2"),
        ("/a\0b\0\0c?x", 100, .behindNUL, "/a\0b\0\0c?\0"),
        ("/a\0?", 100, .behindNUL, "/a\0?"),
        ("/tok\0en", 100, .none, "/tok\0en"),
        // Followed by what is not a version and a NUL: sent raw.
        ("/a\0HTTP/1.x\0?x", 100, .behindNUL, "/a\0HTTP/1.x\0?\0"),
        ("/a\0HTTP/1.1x?x", 100, .behindNUL, "/a\0HTTP/1.1x?\0"),
    ])
    func aQueryIsEndedWhereItStartsWhenTooLongOrBehindANUL(
        _ target: String, _ most: Int, _ cut: RequestTarget.QueryCut, _ left: String
    ) {
        for crlf in [true, false] {
            let ((didCut, seenUpTo), line) = Self.inRequestLine(Array(target.utf8), crlf: crlf) { uri, _ in
                let (cut, seenUpTo) = RequestTarget.cutQuery(uri, most: most)
                return (cut, seenUpTo - uri)
            }
            #expect(didCut == cut, "\(target.debugDescription)")
            #expect(line == Array(left.utf8), "\(target.debugDescription)")
            // Up to the target's end, unless a query was found: no NUL was taken for the end early.
            if cut == .none && !target.contains("?") { #expect(seenUpTo == line.count, "\(target.debugDescription)") }
        }
    }

    /// A target may hold, raw, what follows the NUL before the version: the callback cannot tell
    /// that NUL from the end, and says where it stopped; libmicrohttpd reads the query past it,
    /// where the decoding callback meets it (`HTTPServer.unescaping`).
    @Test(arguments: ["/a\0HTTP/1.1\0?x=1&y", "/a\0HTTP/1.1\0\0?x", "/a\0b\0HTTP/1.0\0?x"])
    func aNULFollowedByAVersionAndANULIsTakenForTheEnd(_ target: String) {
        let ((cut, seenUpTo), line) = Self.inRequestLine(Array(target.utf8)) { uri, _ in
            let (cut, seenUpTo) = RequestTarget.cutQuery(uri, most: 100)
            return (cut, seenUpTo - uri)
        }
        #expect(cut == .none && line == Array(target.utf8))
        #expect(line[seenUpTo] == 0 && Array(line[(seenUpTo + 1)...(seenUpTo + 5)]) == Array("HTTP/".utf8))
    }

    @Test func theBoundOnArgumentsShrinksWithTheTargetsLength() {
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 200) == 44)
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 3072) == 0)
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 5000) == 0)
        #expect(RequestTarget.mostQueryArguments(memory: 1024 * 1024, targetLength: 200) == 12_284)
    }
}
