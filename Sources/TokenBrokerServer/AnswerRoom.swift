internal import CMicroHTTPD

/// What a connection's memory has left for the head of the answer once the request's head is in.
///
/// libmicrohttpd 0.9.75 keeps a connection's request head and the head of its answer in one
/// block of `connectionMemoryLimit` bytes. The request's head stays there, as read, until the
/// answer is sent; beside it go a record for each header, query argument and cookie (56 bytes,
/// 64 in the block's 16-byte units) and a copy of the first `Cookie` header. The answer's head
/// (status line, `Date`, `Content-Length`, `Connection` and the answer's own headers) is built
/// in what is left. It takes any head that fits the block, though, even one that leaves a few
/// bytes; then it cannot build the answer's head, and closes the connection without a byte
/// (`Closing connection (failed to create response header)`).
///
/// So the server refuses, with 431, every head that leaves less than `reserve`: the broker's
/// own answers' heads take under 250 bytes. The 431 goes out as every answer does when its head
/// fits what is left; when it does not, straight to the socket (`DirectAnswer`).
///
/// Measured with 4 KiB and a head of 3 headers: a 400 whose head takes 162 bytes was sent for
/// a head of 3,700 bytes (4,096 − 3,712 − 3 × 64 = 192 left) and not for one of 3,750 (144
/// left); libmicrohttpd gave its own 431 from 3,920 bytes, where the third record no longer fit.
enum AnswerRoom {
    /// What the server keeps free for an answer's head: the broker's own answers' heads (under
    /// 250 bytes), and `margin`.
    static let reserve = 512

    /// What is not counted, and a head sent through libmicrohttpd must leave besides: the bytes
    /// of a request pipelined behind this one that libmicrohttpd has read already (at most its
    /// last growth of the read buffer, 128 bytes, behind a head that large), and empty lines
    /// sent before the request line, which it skips but keeps.
    static let margin = 128

    /// The bytes a record of a header, query argument or cookie takes in the block.
    static let recordBytes = 64

    /// What is left of `memory` bytes for the answer's head, by the layout above.
    /// - Parameters:
    ///   - headBytes: the request line and headers, with their line ends.
    ///   - records: headers, query arguments and cookies.
    ///   - cookieBytes: the length of the first `Cookie` header's value; nil without one.
    static func left(memory: Int, headBytes: Int, records: Int, cookieBytes: Int?) -> Int {
        memory - aligned(headBytes) - records * recordBytes - (cookieBytes.map { aligned($0 + 1) } ?? 0)
    }

    /// What is left on `connection`, whose request head libmicrohttpd has just read whole.
    static func left(_ connection: OpaquePointer, memory: Int) -> Int {
        // Counted kind by kind: the kinds are bits to libmicrohttpd, but cases of a closed enum to Swift.
        func count(_ kind: MHD_ValueKind) -> Int { Int(max(0, MHD_get_connection_values(connection, kind, nil, nil))) }
        let records = count(.HEADER_KIND) + count(.GET_ARGUMENT_KIND) + count(.COOKIE_KIND)
        var cookieBytes = 0
        let hasCookie =
            MHD_lookup_connection_value_n(connection, .HEADER_KIND, "Cookie", 6, nil, &cookieBytes)
            == CMicroHTTPD_yes()
        return left(
            memory: memory, headBytes: CMicroHTTPD_request_header_size(connection),
            records: records,
            cookieBytes: hasCookie ? cookieBytes : nil)
    }

    /// `bytes` rounded up to the block's 16-byte units.
    private static func aligned(_ bytes: Int) -> Int { (bytes + 15) / 16 * 16 }
}
