import CLibFuzzer
import TokenBrokerCore

/// Any bytes as the caller-keys file (`clientKeysFile`), then every key
/// read asked about every provider it names.
func fuzzCallerKeys(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard let list = try? CallerKeyList(json: bytes, knownProviders: ["default", "low", "high"]) else { return 0 }
    for entry in list.entries {
        precondition(entry.digest.count == 32, "a caller key's digest is not 32 bytes")
        for provider in entry.providers ?? [] { _ = entry.mayRead(provider) }
    }
    return 0
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzCallerKeys_main")
func fuzzCallerKeysMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzCallerKeys(data!, size) }
}
