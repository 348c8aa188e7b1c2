// What a connection's memory leaves for an answer's head (`AnswerRoom`).
import Testing

@testable import TokenBrokerServer

@Suite struct AnswerRoomTests {
    /// Measured with libmicrohttpd 0.9.75 and 4 KiB (`AnswerRoom`'s comment): a 400 whose head
    /// takes 162 bytes was sent beside a head of 3,700 bytes with 3 headers, and not beside one of
    /// 3,750; a 403 of 141 bytes beside 3,800 bytes with 2 headers, not beside 3,889.
    @Test(
        arguments: [
            (3700, 3, nil, 192),
            (3750, 3, nil, 144),
            (3800, 2, nil, 160),
            (3889, 2, nil, 64),
            // A cookie's copy, in 16-byte units, and a record for each of its 10 cookies.
            (1000, 3 + 10, 49 as Int?, 4096 - 1008 - 13 * 64 - 64),
        ] as [(Int, Int, Int?, Int)])
    func theRoomLeftIsTheMemoryLessTheHeadItsRecordsAndItsCookiesCopy(
        _ head: Int, _ records: Int, _ cookie: Int?, _ left: Int
    ) {
        #expect(AnswerRoom.left(memory: 4096, headBytes: head, records: records, cookieBytes: cookie) == left)
    }

    @Test func theRoomKeptHoldsTheBroker431sHeadAndTheMargin() {
        let refusal = HTTPResponse(
            status: 431, body: Array(repeating: UInt8(ascii: "x"), count: 300),
            headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store"), ("Connection", "close")])
        let answer = DirectAnswer(refusal, withBody: true)
        #expect(answer.head.count + AnswerRoom.margin <= AnswerRoom.reserve)
    }
}
