import CLibFuzzer
import TokenBrokerCore

/// Any bytes as the configuration file, read and checked as
/// `--check-config` does (a bad file is an error, never a trap); and read leniently as start
/// (`logFormat`) and the commands that ask a running broker (its listeners, `reloadTimeoutSec`)
/// read it first.
func fuzzConfiguration(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard let document = try? BrokerConfiguration.document(bytes) else { return 0 }
    _ = BrokerConfiguration.logFormat(in: document)
    _ = BrokerConfiguration.reloadTimeoutSec(in: document)
    for listener in BrokerConfiguration.Listener.allCases {
        _ = try? BrokerConfiguration.listener(listener, in: document)
    }
    guard let configuration = try? BrokerConfiguration(document: document) else { return 0 }
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
