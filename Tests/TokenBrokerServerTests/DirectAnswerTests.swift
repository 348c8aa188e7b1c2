// The answer written straight to the socket where libmicrohttpd cannot send one (`DirectAnswer`).
import Testing

@testable import TokenBrokerServer

@Suite struct DirectAnswerTests {
    @Test func aDirectAnswerIsTheHeadLibmicrohttpdWritesOnAClosingConnection() {
        let response = HTTPResponse(
            status: 431, body: Array("{}".utf8),
            headers: [
                ("Content-Type", "application/json"), ("Connection", "close"), ("X-Bad", "a\rb"),
                ("Content-Length", "99"), ("Cache-Control", "no-store"),
            ])
        let answer = DirectAnswer(response, withBody: true, now: 0)
        #expect(
            String(decoding: answer.head, as: UTF8.self)
                == "HTTP/1.1 431 Request Header Fields Too Large\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
                + "Connection: close\r\nContent-Length: 2\r\nContent-Type: application/json\r\n"
                + "Cache-Control: no-store\r\n\r\n")
        #expect(answer.body == Array("{}".utf8))
        // To HEAD: the length the body would have, and no body.
        let toHead = DirectAnswer(response, withBody: false, now: 0)
        #expect(toHead.head == answer.head && toHead.body.isEmpty)
    }

    @Test(arguments: [
        (784_111_777, "Sun, 06 Nov 1994 08:49:37 GMT"),  // RFC 9110 §5.6.7's example
        (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        (1_709_251_199, "Thu, 29 Feb 2024 23:59:59 GMT"),
    ])
    func datesAreIMFFixdates(_ time: Int, _ text: String) {
        #expect(DirectAnswer.imfFixdate(time) == text)
    }
}
