internal import CMicroHTTPD
import Glibc

/// The request head as it arrived, checked before any route sees the request (RFC 9112).
///
/// libmicrohttpd 0.9.75 is lenient where a proxy must not be: it takes a body framed by both
/// `Content-Length` and `Transfer-Encoding` as chunked, keeps the first of two `Content-Length`s,
/// treats an unknown `Transfer-Encoding` as "read until close", joins an obs-folded line onto the
/// previous header's *name*, and keeps a space before the colon in the name. None of these can
/// be switched off, and each lets one message be read two ways, which is how requests are
/// smuggled past a proxy. So the broker checks the head itself, and what is ambiguous is refused
/// with 400 and the connection closed (RFC 9112 §6.3, §5.1, §5.2), on every listener and route.
///
/// The check reads two things libmicrohttpd keeps:
/// - each header's name and value, with their lengths and their places in the head;
/// - the head itself: libmicrohttpd parses in place, so the request line and headers are still
///   one block of `MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE` bytes starting at the method, with
///   line ends and colons overwritten by NULs.
///
/// Every byte of that block must be explained by the request line, a `name:` then optional
/// whitespace then the value for each header in order, and line ends. A folded line is not: its
/// bytes sit in the block unclaimed, and the header it was joined to has a name libmicrohttpd
/// built elsewhere. Nor is a NUL inside a value, which libmicrohttpd would cut the value at,
/// with one exception the block cannot show: a NUL just before a bare LF reads as a CR (both
/// are NULs by then), so `X-A: ab<NUL><LF>` is taken as `X-A: ab` ending in CRLF.
///
/// - Important: this leans on how libmicrohttpd 0.9.7x lays out a parsed head. Should a newer
///   version parse elsewhere, sound requests would be refused as malformed, loudly: the
///   integration tests (`test_framing.py`) send both sound and ambiguous heads.
enum RequestHead {
    /// Why a head is refused, in words for the JSON error; nil when it is sound.
    /// - Parameters:
    ///   - targetLength: the target's length as `RequestTarget.measure` found it when the
    ///     request line was read (-1: none, or refused).
    ///   - awaitedBodyLength: set, for a sound head, to the body's length as `Content-Length`
    ///     gives it when the client waits for `100 Continue` before sending the body
    ///     (`Expect: 100-continue`): only such a body can be refused before it is sent without
    ///     the refusal being lost (a client still sending when the connection closes may see
    ///     the reset, not the answer).
    static func problem(
        _ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>, targetLength: Int, awaitedBodyLength: inout Int?
    ) -> String? {
        let size = CMicroHTTPD_request_header_size(connection)
        guard size > 0 else { return "the request head could not be read" }
        var scan = Scan(start: UnsafeRawPointer(method), size: size)
        let versionStart = UnsafeRawPointer(version)
        guard scan.contains(versionStart) else { return "the request line has no HTTP version" }
        if let problem = RequestTarget.problem(
            url: UnsafeRawPointer(url), versionStart: versionStart, measured: targetLength, in: scan)
        {
            return problem
        }
        scan.position = versionStart - scan.start + strlen(version)
        withUnsafeMutablePointer(to: &scan) { pointer in
            _ = MHD_get_connection_values_n(connection, .HEADER_KIND, headerVisitor, pointer)
        }
        if let problem = scan.problem { return problem }
        // What is left is the last header's line end and the empty line: two or four NULs
        // (CRLF each), or fewer where a bare LF ended a line.
        let rest = scan.size - scan.position
        guard (1...4).contains(rest), scan.allZero(from: scan.position, count: rest) else {
            return "the request head has a line that is not a header (obs-fold or malformed line)"
        }
        let isHTTP10 = strcmp(version, "HTTP/1.0") == 0
        if let problem = scan.framingProblem(isHTTP10: isHTTP10) { return problem }
        // libmicrohttpd sends `100 Continue` only to HTTP/1.1 clients: an HTTP/1.0 one does not wait.
        awaitedBodyLength = scan.expectsContinue && !isHTTP10 ? scan.contentLength : nil
        return nil
    }

    /// The walk through the block, one header at a time, and what framing headers were seen.
    struct Scan {
        let start: UnsafeRawPointer
        let size: Int
        /// Offset of the first byte not yet explained.
        var position = 0
        var problem: String?
        var contentLengths = 0
        var contentLengthValid = true
        /// The last `Content-Length`'s value, when it is digits only (at most 18: it fits).
        var contentLength: Int?
        /// `Expect: 100-continue`: the body comes only after a go-ahead.
        var expectsContinue = false
        var transferEncodings = 0
        var transferEncodingChunked = true
        var hosts = 0
        var hostValid = true

        init(start: UnsafeRawPointer, size: Int) {
            self.start = start
            self.size = size
        }

        func contains(_ pointer: UnsafeRawPointer) -> Bool { pointer >= start && pointer < start + size }

        func byte(_ offset: Int) -> UInt8 { start.load(fromByteOffset: offset, as: UInt8.self) }

        func allZero(from offset: Int, count: Int) -> Bool {
            (offset..<offset + count).allSatisfy { byte($0) == 0 }
        }

        /// One header, as libmicrohttpd lists it; false stops the walk.
        mutating func visit(name: UnsafeRawPointer, nameCount: Int, value: UnsafeRawPointer, valueCount: Int) -> Bool {
            guard contains(name), value >= name + nameCount + 1, value + valueCount <= start + size else {
                problem = "a header line is folded onto the next line (obs-fold)"
                return false
            }
            let nameOffset = name - start
            let valueOffset = value - start
            // Between the previous line and this name: one line end (CRLF as two NULs, LF as one).
            let gap = nameOffset - position
            guard (1...2).contains(gap), allZero(from: position, count: gap) else {
                problem = "the request head has a line that is not a header (obs-fold or malformed line)"
                return false
            }
            let nameBytes = UnsafeRawBufferPointer(start: name, count: nameCount)
            guard nameCount > 0, nameBytes.allSatisfy({ $0.isHTTPTokenCharacter }) else {
                problem =
                    "a header name is empty or holds characters other than letters, digits and !#$%&'*+-.^_`|~ (RFC 9110 §5.1)"
                return false
            }
            // The colon (now a NUL), then optional whitespace, then the value.
            guard byte(nameOffset + nameCount) == 0,
                (nameOffset + nameCount + 1..<valueOffset).allSatisfy({ byte($0).isHTTPBlank })
            else {
                problem = "a header line is malformed"
                return false
            }
            let valueBytes = UnsafeRawBufferPointer(start: value, count: valueCount)
            guard valueBytes.allSatisfy(HTTPSyntax.isFieldValueByte) else {
                problem = "a header value holds a control character (RFC 9110 §5.5)"
                return false
            }
            position = valueOffset + valueCount
            noteFraming(name: nameBytes, value: valueBytes)
            return true
        }

        /// Values are judged as libmicrohttpd reads them, leading whitespace gone and trailing
        /// whitespace kept: `chunked ` is not `chunked` to it (it would read the body until the
        /// connection closes), so it is not to the broker either.
        private mutating func noteFraming(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            if HTTPSyntax.equalsIgnoringCase(name, "content-length") {
                contentLengths += 1
                contentLengthValid =
                    contentLengthValid && !value.isEmpty && value.count <= 18
                    && value.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                contentLength = contentLengthValid ? value.reduce(0) { $0 * 10 + Int($1 - 0x30) } : nil
            } else if HTTPSyntax.equalsIgnoringCase(name, "transfer-encoding") {
                transferEncodings += 1
                transferEncodingChunked = transferEncodingChunked && HTTPSyntax.equalsIgnoringCase(value, "chunked")
            } else if HTTPSyntax.equalsIgnoringCase(name, "expect") {
                expectsContinue = HTTPSyntax.equalsIgnoringCase(value, "100-continue")
            } else if HTTPSyntax.equalsIgnoringCase(name, "host") {
                hosts += 1
                hostValid = hostValid && HTTPSyntax.isHost(value)
            }
        }

        /// RFC 9112 §6.1 and §6.3: exactly one way to find the body's end; §3.2: one `Host`.
        func framingProblem(isHTTP10: Bool) -> String? {
            if hosts > 1 || (hosts == 0 && !isHTTP10) {
                return "an HTTP/1.1 request needs exactly one Host header (RFC 9112 §3.2)"
            }
            if !hostValid { return "the Host header is not a host and optional port (RFC 9112 §3.2, RFC 3986 §3.2.2)" }
            if transferEncodings > 0 && contentLengths > 0 {
                return "Content-Length and Transfer-Encoding together are refused (RFC 9112 §6.3)"
            }
            if contentLengths > 1 { return "more than one Content-Length is refused (RFC 9112 §6.3)" }
            if !contentLengthValid { return "Content-Length must be 1 to 18 digits and nothing else (RFC 9112 §6.2)" }
            if transferEncodings > 1 || !transferEncodingChunked {
                return "the only Transfer-Encoding accepted is one header of exactly \"chunked\" (RFC 9112 §6.1)"
            }
            if transferEncodings > 0 && isHTTP10 { return "Transfer-Encoding is refused in HTTP/1.0 (RFC 9112 §6.1)" }
            return nil
        }
    }
}

/// The request line's target, which libmicrohttpd hands over as C strings it decoded in place:
/// a NUL in it, sent raw or as `%00` in the path, would end the path early, and the route would
/// see `/token` where the client (and any proxy in front) sent `/token%00.png` or
/// `/token<NUL>/x`. So the target is measured as sent, before it is decoded, and refused with
/// 400 when it holds a NUL. (A `%00` in the query stays in the decoded value, where the query's
/// readers refuse it: `HTTPRequest.query`.)
enum RequestTarget {
    /// The length of the target `uri` up to its first NUL, as libmicrohttpd hands it to the
    /// request-line callback before decoding it; -1 when its path (what precedes `?`) has `%00`;
    /// `spaceOrControl` when it holds a space or a control character.
    static func measure(_ uri: UnsafePointer<CChar>) -> Int {
        // No space, tab or other control, nor DEL (RFC 9112 §3.2, RFC 3986 §2): libmicrohttpd
        // takes the line's last space for the one before the version, so `GET /token /x HTTP/1.1`
        // reached the routes as the path `/token /x`, which a server in front may read another way.
        let length = CMicroHTTPD_target_length(uri)
        guard length >= 0 else { return spaceOrControl }
        if let escape = strstr(uri, "%00") {
            // Only the first `?` ends the path; one after the escape leaves it in the path too.
            let query = strchr(uri, Int32(UInt8(ascii: "?")))
            if query.map({ escape < $0 }) ?? true { return -1 }
        }
        return Int(length)
    }

    /// What `measure` says of a target with a space or a control character in it.
    static let spaceOrControl = -3

    /// What the request-line callback notes instead of the target's length when it cut the
    /// target's query (`cutQuery`); the head is then refused with 414.
    static let queryCut = -2

    /// The most query arguments a target of `targetLength` bytes may have on a connection with
    /// `memory` bytes: libmicrohttpd keeps each in a record of about 56 bytes of that memory,
    /// beside the read buffer, which grows to hold the request line. Measured with 4 KiB, a
    /// connection hung from about 56 bytes an argument plus the target's length past 3,750; so
    /// the two may take three quarters of it, at 64 bytes an argument (44 in a target of 200
    /// bytes in 4 KiB, none in one of 3 KiB).
    static func mostQueryArguments(memory: Int, targetLength: Int) -> Int {
        max(0, (memory * 3 / 4 - targetLength) / 64)
    }

    /// How `cutQuery` left a target's query.
    enum QueryCut: Equatable {
        /// Left as it came: none, or at most `most` arguments.
        case none
        /// Ended where it starts: it has more than `most` arguments (the head then gets 414).
        case tooManyArguments
        /// Ended where it starts: a NUL sent raw comes before it, so the head's check refuses the
        /// target anyway (400).
        case behindNUL
    }

    /// Ends the query of the target `uri` where it starts when libmicrohttpd could not hold its
    /// arguments, or when a NUL sent raw comes before it; says which, and how far it read.
    ///
    /// libmicrohttpd 0.9.75 reads the query's arguments into the connection's memory right after
    /// this callback. When they do not fit, it queues its 431 and then goes on reading the head
    /// as if nothing had happened (`parse_initial_message_line`'s caller sets the next state over
    /// the error's), with the read buffer it freed for the answer: the connection then hangs,
    /// unanswered, until its timeout, and a request pipelined behind it is lost. Ending the
    /// query where it starts, in libmicrohttpd's own buffer (it writes there itself: the target's
    /// `?` becomes the NUL that ends the path), leaves it nothing to read; the server then
    /// answers when the head is in, and closes the connection.
    ///
    /// libmicrohttpd finds the `?` over the whole target (`memchr` up to the space before the
    /// version), and reads the arguments from there up to the next NUL, while `uri` is a C
    /// string that ends at the target's first NUL. So when no `?` comes before that NUL, the
    /// NUL is looked at: the one libmicrohttpd wrote over the space before the version is
    /// followed by the version (`HTTP/d.d`, which it checked) and the NUL it wrote over the
    /// line's end. Any other NUL was sent raw, and the rest of the target is searched for the
    /// `?`, from NUL to NUL, up to the first NUL that is so followed. Every byte read lies in
    /// the request line: each NUL met before the target's real end has at least the 9 bytes
    /// that follow the real one after it.
    ///
    /// - Returns: what was done, and `seenUpTo`, the NUL where the search stopped: the target's
    ///   end as far as the callback can tell. A target can still hold, raw, a NUL followed by
    ///   `HTTP/1.1` and a NUL, and a query after it: libmicrohttpd then reads arguments past
    ///   `seenUpTo`, where the server's decoding callback meets them (`HTTPServer.unescaping`).
    static func cutQuery(_ uri: UnsafeMutablePointer<CChar>, most: Int) -> (
        cut: QueryCut, seenUpTo: UnsafeMutablePointer<CChar>
    ) {
        var end = uri + strlen(uri)
        if let mark = strchr(uri, Int32(UInt8(ascii: "?"))) {
            return (hasMoreArguments(after: mark, than: most) ? cut(at: mark, .tooManyArguments) : .none, end)
        }
        while !endsTarget(end) {
            let part = end + 1
            let partEnd = part + strlen(part)
            if let mark = memchr(part, Int32(UInt8(ascii: "?")), partEnd - part) {
                return (cut(at: mark.assumingMemoryBound(to: CChar.self), .behindNUL), partEnd)
            }
            end = partEnd
        }
        return (.none, end)
    }

    /// Whether the query that starts after `mark` (a C string up to its first NUL, as
    /// libmicrohttpd reads it) has more than `most` arguments. An empty query has none; a target
    /// too long for even one may have none.
    private static func hasMoreArguments(after mark: UnsafeMutablePointer<CChar>, than most: Int) -> Bool {
        guard (mark + 1).pointee != 0 else { return false }
        var arguments = 1
        var cursor = mark + 1
        while arguments <= most, let separator = strchr(cursor, Int32(UInt8(ascii: "&"))) {
            arguments += 1
            cursor = separator + 1
        }
        return arguments > most
    }

    /// Ends the query after `mark` where it starts.
    private static func cut(at mark: UnsafeMutablePointer<CChar>, _ why: QueryCut) -> QueryCut {
        (mark + 1).pointee = 0
        return why
    }

    /// Whether the NUL at `nul` can be the one libmicrohttpd wrote over the space before the
    /// version: `HTTP/d.d` (the only version it takes, 8 bytes up to the line's end) and a NUL
    /// follow it.
    static func endsTarget(_ nul: UnsafePointer<CChar>) -> Bool {
        let bytes = UnsafeRawPointer(nul + 1).assumingMemoryBound(to: UInt8.self)
        func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }
        return bytes[0] == UInt8(ascii: "H") && bytes[1] == UInt8(ascii: "T") && bytes[2] == UInt8(ascii: "T")
            && bytes[3] == UInt8(ascii: "P") && bytes[4] == UInt8(ascii: "/") && isDigit(bytes[5])
            && bytes[6] == UInt8(ascii: ".") && isDigit(bytes[7]) && bytes[8] == 0
    }

    /// Why a target with a NUL in it is refused.
    static let nulProblem = "the request target holds a NUL, sent raw or as %00 in the path"

    /// Why the target is refused; nil when it is sound. libmicrohttpd ends the target one byte
    /// before the version (the space, now a NUL), so the target as sent spans from `url` to
    /// there: when it measured shorter as the line was read, a NUL sits inside it.
    static func problem(
        url: UnsafeRawPointer, versionStart: UnsafeRawPointer, measured: Int, in scan: RequestHead.Scan
    ) -> String? {
        if measured == spaceOrControl {
            return "the request target holds a space or a control character (RFC 9112 §3.2)"
        }
        guard measured >= 0, scan.contains(url), url < versionStart, versionStart - 1 - url == measured else {
            return nulProblem
        }
        return nil
    }
}

/// The byte classes of RFC 9110 §5, for checks that run on every request (`tchar`, shared with
/// the configuration's checks, is `UInt8.isHTTPTokenCharacter`).
enum HTTPSyntax {
    /// A byte a field value may hold: visible ASCII, space, tab, or obs-text; no other control.
    static func isFieldValueByte(_ byte: UInt8) -> Bool {
        byte == 0x09 || (byte >= 0x20 && byte != 0x7F)
    }

    /// Whether `value` (as libmicrohttpd reads it: whitespace after it kept) is a `Host` value:
    /// `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2), or empty. The host is an IP
    /// literal in brackets (a zone id after `%25` included, RFC 6874), or a name or IPv4 address
    /// of unreserved characters, sub-delims and percent-escapes; the port, digits. Nothing else:
    /// no space, `/`, `@`, `?` or `#`.
    static func isHost(_ value: UnsafeRawBufferPointer) -> Bool {
        let end = countWithoutTrailingBlanks(value)
        var index = 0
        if end > 0, value[0] == UInt8(ascii: "[") {
            index = 1
            while index < end, value[index] != UInt8(ascii: "]") {
                if value[index] == UInt8(ascii: "%") {
                    guard isEscape(value, at: index, end: end) else { return false }
                    index += 3
                    continue
                }
                guard isUnreservedOrSubDelimiter(value[index]) || value[index] == UInt8(ascii: ":") else {
                    return false
                }
                index += 1
            }
            guard index < end, index > 1 else { return false }
            index += 1
        } else {
            while index < end, value[index] != UInt8(ascii: ":") {
                if value[index] == UInt8(ascii: "%") {
                    guard isEscape(value, at: index, end: end) else { return false }
                    index += 3
                    continue
                }
                guard isUnreservedOrSubDelimiter(value[index]) else { return false }
                index += 1
            }
        }
        guard index < end else { return true }
        guard value[index] == UInt8(ascii: ":") else { return false }
        return value[(index + 1)..<end].allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }

    /// How many bytes `value` has before the blanks that end it: libmicrohttpd keeps them, though
    /// they are not part of a header's value (RFC 9110 §5.5).
    static func countWithoutTrailingBlanks(_ value: UnsafeRawBufferPointer) -> Int {
        var end = value.count
        while end > 0, value[end - 1].isHTTPBlank { end -= 1 }
        return end
    }

    /// Whether a percent-escape (`%` and two hex digits) starts at `index`, before `end`.
    private static func isEscape(_ value: UnsafeRawBufferPointer, at index: Int, end: Int) -> Bool {
        index + 2 < end && value[index + 1].hexDigitValue != nil && value[index + 2].hexDigitValue != nil
    }

    /// RFC 3986 §2.2–2.3: `unreserved` (letters, digits, `-._~`) or `sub-delims` (`!$&'()*+,;=`).
    private static func isUnreservedOrSubDelimiter(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): true
        case UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"), UInt8(ascii: "'"), UInt8(ascii: "("),
            UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: ","), UInt8(ascii: ";"),
            UInt8(ascii: "="):
            true
        default: false
        }
    }

    /// ASCII case-insensitive comparison with a lower-case literal.
    static func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
        let expected = UnsafeRawBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount)
        for index in 0..<bytes.count {
            var byte = bytes[index]
            if byte >= 0x41 && byte <= 0x5A { byte |= 0x20 }
            if byte != expected[index] { return false }
        }
        return true
    }
}

// libmicrohttpd's header iterator: the context is the `RequestHead.Scan`.
private let headerVisitor: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
    guard let cls, let key else { return CMicroHTTPD_no() }
    let scan = cls.assumingMemoryBound(to: RequestHead.Scan.self)
    // A header with no value at all has none to place; an empty one sits where the line ends.
    let valuePointer = value.map(UnsafeRawPointer.init) ?? UnsafeRawPointer(key) + keySize + 1
    let keep = scan.pointee.visit(
        name: UnsafeRawPointer(key), nameCount: keySize, value: valuePointer, valueCount: value == nil ? 0 : valueSize)
    return keep ? CMicroHTTPD_yes() : CMicroHTTPD_no()
}
