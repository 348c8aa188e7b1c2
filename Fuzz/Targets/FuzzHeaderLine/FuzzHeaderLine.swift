import CLibFuzzer

@testable import TokenBrokerServer
@testable import TokenBrokerUpstream

/// Any bytes as one line of an upstream answer's head, as libcurl hands it to the header
/// callback in proxy mode (`HeaderLine`), then through the check every answer header passes
/// before libmicrohttpd sends it (`HTTPSyntax`).
///
/// Besides not trapping: a field's name holds no colon; its value has no blank around it; a
/// value that could end a header line early (CR, LF, NUL or another control byte) is one the
/// server refuses to send, so no upstream can add a header of its own making; a value is bytes
/// of the line, in order, as sent (the proxy passes them on: no byte is replaced, even one that
/// is not UTF-8); and a value the server sends reads the same when written back as
/// `name: value` and read again.
func fuzzHeaderLine(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let line = UnsafeRawBufferPointer(start: data, count: size)
    guard case .field(let name, let value)? = HeaderLine(line) else { return 0 }
    precondition(!name.utf8.contains(UInt8(ascii: ":")), "a colon in the name \(name.debugDescription)")
    for blank in [UInt8(ascii: " "), UInt8(ascii: "\t")] {
        precondition(value.first != blank && value.last != blank, "blanks around \(value)")
    }
    // Read independently: the value starts after the first colon and the blanks after it.
    if let colon = line.firstIndex(of: UInt8(ascii: ":")) {
        let start = line[(colon + 1)...].firstIndex { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\t") }
        precondition(
            value.isEmpty || start.map { line[$0...].starts(with: value) } == true, "\(value) is not the line's bytes")
    } else {
        preconditionFailure("a field without a colon")
    }
    let sendable = value.allSatisfy(HTTPSyntax.isFieldValueByte)
    let breaksLines = value.contains { $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\n") || $0 == 0 }
    precondition(!(breaksLines && sendable), "the server would send \(value)")
    guard sendable else { return 0 }
    let again = (Array("\(name): ".utf8) + value + Array("\r\n".utf8)).withUnsafeBytes { HeaderLine($0) }
    precondition(
        again == .field(name, value), "\(name.debugDescription): \(value) reads back as \(String(describing: again))")
    return 0
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzHeaderLine_main")
func fuzzHeaderLineMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzHeaderLine(data!, size) }
}
