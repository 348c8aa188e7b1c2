import CLibFuzzer
import TokenBrokerCore

/// Any bytes as the configuration file, read and checked as
/// `--check-config` does (a bad file is an error, never a trap).
func fuzzConfiguration(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard let configuration = try? BrokerConfiguration(json: bytes) else { return 0 }
    _ = try? configuration.validate()
    return 0
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzConfiguration_main")
func fuzzConfigurationMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzConfiguration(data!, size) }
}
