import CLibFuzzer
import TokenBrokerProxy

/// Any bytes as the request target of a proxied request.
///
/// Besides not trapping, an accepted target must hold what the proxy relies on: a path that
/// starts with "/" and holds no dot segment and no raw byte outside the characters allowed.
func fuzzProxyPath(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let raw = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    guard case .success(let target) = ProxyPath.parse(raw) else { return 0 }
    precondition(!target.proxy.isEmpty && !target.proxy.contains("/"), "bad proxy name \(target.proxy)")
    precondition(target.path.hasPrefix("/"), "path does not start with /: \(target.path)")
    let segments = target.path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
    precondition(!segments.contains { $0 == "." || $0 == ".." }, "dot segment left in \(target.path)")
    precondition(target.path.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }, "raw byte left in \(target.path)")
    return 0
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzProxyPath_main")
func fuzzProxyPathMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzProxyPath(data!, size) }
}
