import CLibFuzzer

@testable import TokenBrokerAPI

/// The values the token routes read from a query or an `If-None-Match`
/// header (`after=3`, `timeout=30`, `"3"`), as libmicrohttpd hands them over, percent-decoded.
///
/// The input is read as a query parameter's value and as an `If-None-Match` header; a number
/// that comes out must be one the input spells in digits.
func fuzzQuery(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    if let version = QueryParameters.number(text) {
        precondition(
            String(version) == String(text.drop { $0 == "0" }.isEmpty ? "0" : text.drop { $0 == "0" }),
            "\(text) read as \(version)")
    }
    if let version = QueryParameters.entityTagVersion(text) {
        precondition(text.contains(String(version)), "\(text) read as version \(version)")
    }
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
