// The request target as the request-line callback sees it, before libmicrohttpd reads it:
// its length and what it may not hold (`RequestTarget.measure`), and the bound on its query's
// arguments (`RequestTarget.cutQuery`).
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

    @Test(arguments: [
        ("/t?a=1&b=2", 2, false, "/t?a=1&b=2"),
        ("/t?a=1&b=2&c=3", 2, true, "/t?"),
        ("/t?a=1", 0, true, "/t?"),
        ("/t?", 0, false, "/t?"),
        ("/t", 0, false, "/t"),
        ("/t&x&y?a", 1, false, "/t&x&y?a"),  // an & in the path separates no arguments
    ])
    func aQueryWithMoreThanTheMostArgumentsIsEndedWhereItStarts(
        _ target: String, _ most: Int, _ cut: Bool, _ left: String
    ) {
        var bytes = Array(target.utf8CString)
        let didCut = bytes.withUnsafeMutableBufferPointer { RequestTarget.cutQuery($0.baseAddress!, most: most) }
        #expect(didCut == cut, "\(target)")
        #expect(String(cString: bytes) == left)
    }

    @Test func theBoundOnArgumentsShrinksWithTheTargetsLength() {
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 200) == 44)
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 3072) == 0)
        #expect(RequestTarget.mostQueryArguments(memory: 4096, targetLength: 5000) == 0)
        #expect(RequestTarget.mostQueryArguments(memory: 1024 * 1024, targetLength: 200) == 12_284)
    }
}
