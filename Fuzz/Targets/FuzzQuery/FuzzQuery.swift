import CLibFuzzer
import CMicroHTTPD
import TokenBrokerCore

@testable import TokenBrokerAPI
@testable import TokenBrokerServer

/// A template taking the three values, with exact and prefix entries in its allow-lists.
let template: ProviderConfiguration = {
    var configuration = ProviderConfiguration(name: "fuzz")
    configuration.perRequest = [.audience, .scope, .resource]
    configuration.allowedAudiences = [AllowPattern("https://a.example")!, AllowPattern("https://b.example/*")!]
    configuration.allowedScopes = [AllowPattern("read")!, AllowPattern("storage.*")!]
    configuration.allowedResources = [AllowPattern("urn:r")!, AllowPattern("h*")!]
    return configuration
}()

/// The values the token routes read from a query or an `If-None-Match`
/// header (`after=3`, `timeout=30`, `"3"`, `audience=…`), as libmicrohttpd hands them over, percent-decoded.
///
/// The input is read as a query parameter's value and as an `If-None-Match` header; a number
/// that comes out must be one the input spells in digits, and the input's lines read as the
/// header's lines must say what they say joined into one. It is also read as each value of a
/// template's child: an accepted one is the input itself (the scope, the input's set of tokens),
/// visible ASCII, within the length limit and allowed by the template's list. And it is read as
/// the `Host` of a compatibility route, whose check must agree with one written plainly. Before
/// any of that, the server's percent-decoding of a target (`CMicroHTTPD_unescape`) must give
/// libmicrohttpd's own `MHD_http_unescape`'s bytes for it, and the input read as a query's
/// parameters must come back from `HTTPFields` as they went in, and the input read as an
/// `Authorization` header must give the caller key a plain reading finds. And the input as a
/// request target, in a request line as libmicrohttpd leaves it, must leave it no query to read
/// that the server has not counted or cannot see (`fuzzRequestLine`).
func fuzzQuery(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    fuzzUnescape(UnsafeBufferPointer(start: data, count: size))
    fuzzRequestLine(UnsafeBufferPointer(start: data, count: size))
    fuzzFields(UnsafeBufferPointer(start: data, count: size))
    fuzzBearerKey(UnsafeBufferPointer(start: data, count: size))
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    if let version = QueryParameters.number(text) {
        precondition(
            String(version) == String(text.drop { $0 == "0" }.isEmpty ? "0" : text.drop { $0 == "0" }),
            "\(text) read as \(version)")
    }
    // A version read from `If-None-Match` is one its text names, or, for `*`, the version held now.
    let held: UInt64 = 987_654_321
    if let version = QueryParameters.entityTagVersion(text, current: { held }) {
        precondition(
            text.contains(String(version)) || (version == held && text.contains("*")),
            "\(text) read as version \(version)")
    }
    // Lines of `If-None-Match` are one list: read line by line, they say what the lines joined
    // with commas say as one line.
    var tags = QueryParameters.EntityTags()
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
    for line in lines { tags.read(String(line)) }
    precondition(
        tags.version(current: { held })
            == QueryParameters.entityTagVersion(lines.joined(separator: ","), current: { held }),
        "\(text) read otherwise line by line")
    fuzzRequestValues(text)
    precondition(text.withUTF8Bytes(CompatHost.isLocal) == plainlyLocal(text), "Host \(text.debugDescription)")
    return 0
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzQuery_main")
func fuzzQueryMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzQuery(data!, size) }
}

/// `text` as the audience, the scope and the resource of a template's child.
func fuzzRequestValues(_ text: String) {
    func acceptable(_ value: String) -> Bool {
        !value.isEmpty && value.utf8.count <= TokenRequestValues.maximumLength
            && value.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }
    if case .success(let values) = TokenRequestValues.checked(
        audience: text, scope: nil, resource: nil, for: template)
    {
        precondition(values.audience == text && acceptable(text), "audience \(text.debugDescription) accepted")
        precondition(template.allowedAudiences.contains { $0.matches(text) }, "audience outside the list")
    }
    if case .success(let values) = TokenRequestValues.checked(
        audience: nil, scope: nil, resource: text, for: template)
    {
        precondition(values.resource == text && acceptable(text), "resource \(text.debugDescription) accepted")
    }
    if case .success(let values) = TokenRequestValues.checked(audience: nil, scope: text, resource: nil, for: template)
    {
        let tokens = text.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        precondition(values.scopes == Array(Set(tokens)).sorted(), "scope \(text.debugDescription) read as \(values)")
        precondition(tokens.allSatisfy(acceptable), "scope \(text.debugDescription) accepted")
        precondition(
            tokens.allSatisfy { token in template.allowedScopes.contains { $0.matches(token) } },
            "a scope token outside the list")
    }
}

/// `bytes` split as a query is (`&` between parameters, the first `=` between a name and its
/// value, none without one), kept in `HTTPFields`: every name and value reads back as it went in,
/// and the look-ups by name answer as the same look-ups over the strings do. The bytes are also
/// a header value that `sameText(utf8:_:)` must compare as `String`'s `==` compares its string.
func fuzzFields(_ bytes: UnsafeBufferPointer<UInt8>) {
    let pairs: [(String, String?)] = bytes.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: false).map {
        part in
        guard let equals = part.firstIndex(of: UInt8(ascii: "=")) else {
            return (String(decoding: part, as: UTF8.self), nil)
        }
        return (
            String(decoding: part[..<equals], as: UTF8.self),
            String(decoding: part[(equals + 1)...], as: UTF8.self)
        )
    }
    let fields = HTTPFields(pairs)
    precondition(fields.count == pairs.count, "\(pairs.count) fields kept as \(fields.count)")
    for (index, pair) in pairs.enumerated() {
        precondition(fields.name(at: index) == pair.0 && fields.value(at: index) == pair.1, "field \(index) changed")
    }
    // The first eight names, in the input's order (not a set's, which changes from run to run).
    var names: [String] = []
    for pair in pairs where names.count < 8 && !names.contains(pair.0) { names.append(pair.0) }
    for name in names {
        for asked in [name, name.uppercased(), name.lowercased()] {
            let index = pairs.firstIndex { $0.0.equalsIgnoringASCIICase(asked) }
            let count = pairs.count { $0.0.prefix { $0 != "\u{0}" }.equalsIgnoringASCIICase(asked) }
            precondition(fields.firstIndex(named: asked) == index, "\(asked.debugDescription) found elsewhere")
            precondition(fields.count(namedUpToNUL: asked) == count, "\(asked.debugDescription) counted otherwise")
        }
    }
    let text = String(decoding: bytes, as: UTF8.self)
    for expected in ["Google", text, String(text.prefix(3))] {
        precondition(
            sameText(utf8: bytes, expected) == (text == expected), "\(text.debugDescription) compared otherwise")
    }
}

/// `bytes` as an `Authorization` header: the key `CallerKeyStore.bearerKey` reads is the one a
/// plain reading on copies finds (the scheme `bearer ` in any case, then spaces, then the key: the
/// rest, not empty, without a space), it lies at the end of the header, as sent, and in ASCII it
/// is the one the earlier reading on a string found.
func fuzzBearerKey(_ bytes: UnsafeBufferPointer<UInt8>) {
    let plain: [UInt8]? = {
        let all = Array(bytes)
        guard all.count > 7, all.prefix(7).map(\.asciiLowercased) == Array("bearer ".utf8) else { return nil }
        let key = all.dropFirst(7).drop { $0 == 0x20 }
        return key.isEmpty || key.contains(0x20) ? nil : Array(key)
    }()
    let key = CallerKeyStore.bearerKey(bytes)
    precondition(key.map(Array.init) == plain, "\(Array(bytes)) read as the key \(key.map(Array.init) ?? [])")
    if let key, let start = key.baseAddress, let base = bytes.baseAddress {
        precondition(start + key.count == base + bytes.count, "the key is not the end of the header")
    }
    // In ASCII, where a string's characters are its bytes, the key is the one the reading on a
    // string that came before it found (it took `Bearer` and the spaces as characters).
    if bytes.allSatisfy({ $0 < 0x80 }) {
        let text = Substring(String(decoding: bytes, as: UTF8.self))
        var textual: Substring?
        if text.count > 7, text.prefix(7).equalsIgnoringASCIICase("bearer ") {
            let rest = text.dropFirst(7).drop { $0 == " " }
            if !rest.isEmpty, !rest.contains(" ") { textual = rest }
        }
        precondition(key.map(Array.init) == textual.map { Array($0.utf8) }, "\(text.debugDescription) read otherwise")
    }
}

/// Decodes `bytes`, up to a NUL as libmicrohttpd reads a target, with the server's decoder and
/// with libmicrohttpd's: the same length, the same bytes.
func fuzzUnescape(_ bytes: UnsafeBufferPointer<UInt8>) {
    func decoded(_ decode: (UnsafeMutablePointer<CChar>) -> Int) -> [CChar] {
        var buffer = bytes.map { CChar(bitPattern: $0) } + [0]
        return buffer.withUnsafeMutableBufferPointer { Array($0[..<decode($0.baseAddress!)]) }
    }
    let ours = decoded { CMicroHTTPD_unescape(nil, nil, $0) }
    precondition(ours == decoded { MHD_http_unescape($0) }, "decoded \(Array(bytes)) otherwise than libmicrohttpd")
}

/// `bytes` (the first one choosing the most arguments and the line's end) as the target of a
/// request line laid out as libmicrohttpd leaves it for the request-line callback, in memory of
/// exactly its size (AddressSanitizer then catches a read past it): `GET`, NUL, the target (any
/// bytes but LF, NULs among them), NUL, `HTTP/1.1`, and one NUL for a bare LF or two for CRLF.
///
/// After `RequestTarget.cutQuery`, the query libmicrohttpd reads (from the first `?` of the whole
/// target up to the next NUL) is empty, or lies within what the callback saw and has at most the
/// most arguments, or starts past what it saw (where the decoding callback refuses it); the
/// target changed, if at all, only in the byte after that `?`; and what it saw ends at a NUL
/// within the target, or at its end.
func fuzzRequestLine(_ bytes: UnsafeBufferPointer<UInt8>) {
    guard let first = bytes.first else { return }
    let target = bytes.dropFirst().filter { $0 != UInt8(ascii: "\n") }
    guard !target.isEmpty else { return }
    let most = Int(first & 0x3F)
    let line = Array("GET".utf8) + [0] + target + [0] + Array("HTTP/1.1".utf8) + (first & 0x40 == 0 ? [0, 0] : [0])
    let memory = UnsafeMutablePointer<UInt8>.allocate(capacity: line.count)
    defer { memory.deallocate() }
    memory.initialize(from: line, count: line.count)
    let start = memory + 4
    let (cut, seenUpTo) = start.withMemoryRebound(to: CChar.self, capacity: target.count + 1) {
        let (cut, seenUpTo) = RequestTarget.cutQuery($0, most: most)
        return (cut, seenUpTo - $0)
    }
    let after = Array(UnsafeBufferPointer(start: start, count: target.count))
    precondition((0...target.count).contains(seenUpTo) && start[seenUpTo] == 0, "stopped at \(seenUpTo)")
    // Short of the end, it stops at a NUL that has the query before it, or that is followed, as
    // the real end is, by a version and a NUL.
    let version = Array(UnsafeBufferPointer(start: start + seenUpTo + 1, count: 9))
    precondition(
        seenUpTo == target.count || target[..<seenUpTo].contains(UInt8(ascii: "?"))
            || (version.starts(with: Array("HTTP/".utf8)) && version[6] == UInt8(ascii: ".") && version[8] == 0
                && [version[5], version[7]].allSatisfy { (0x30...0x39).contains($0) }),
        "stopped at \(seenUpTo), before \(version)")
    guard let mark = target.firstIndex(of: UInt8(ascii: "?")) else {
        precondition(cut == .none && after == Array(target), "changed a target without a query")
        return
    }
    var changed = Array(target)
    if cut != .none, mark + 1 < changed.count { changed[mark + 1] = 0 }
    precondition(after == changed, "changed the target elsewhere than after its ?")
    let nulBefore = after[..<mark].contains(0)
    precondition(cut != .behindNUL || nulBefore, "cut behind a NUL that is not there")
    precondition(cut != .tooManyArguments || !nulBefore, "counted arguments behind a NUL")
    let query = after[(mark + 1)...].prefix { $0 != 0 }
    let arguments = query.isEmpty ? 0 : 1 + query.count { $0 == UInt8(ascii: "&") }
    precondition(
        arguments == 0 || (mark < seenUpTo && arguments <= most) || mark > seenUpTo,
        "libmicrohttpd reads \(arguments) arguments at \(mark), the server saw up to \(seenUpTo)")
}

/// `CompatHost.isLocal` written plainly, on copies and splits: a loopback or metadata server name,
/// with an optional port of 1–5 digits.
func plainlyLocal(_ text: String) -> Bool {
    let bytes = Array(text.utf8)
    func isPort(_ part: ArraySlice<UInt8>) -> Bool {
        (1...5).contains(part.count) && part.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }
    if bytes.first == UInt8(ascii: "[") {
        let literal = Array("[::1]".utf8)
        guard bytes.starts(with: literal) else { return false }
        let rest = bytes[literal.count...]
        return rest.isEmpty || (rest.first == UInt8(ascii: ":") && isPort(rest.dropFirst()))
    }
    var name = bytes[...]
    if let colon = bytes.lastIndex(of: UInt8(ascii: ":")) {
        guard isPort(bytes[(colon + 1)...]) else { return false }
        name = bytes[..<colon]
    }
    let lower = String(decoding: name.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self)
    if ["localhost", "metadata.google.internal", "metadata", "169.254.169.254"].contains(lower) { return true }
    let parts = lower.split(separator: ".", omittingEmptySubsequences: false)
    return parts.count == 4 && parts[0] == "127"
        && parts.allSatisfy { part in
            (1...3).contains(part.utf8.count) && part.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } && Int(part)! <= 255
        }
}
