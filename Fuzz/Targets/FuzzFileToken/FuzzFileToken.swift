import CLibFuzzer
import Glibc
import TokenBrokerCore

@testable import TokenBrokerSources

/// The `file` source reading a token whose JWT claims are the input.
///
/// The input is the JWT's payload (JSON claims such as `{"exp":1700000000}`). It is made into a
/// compact JWT, written to a file, and read by `FileTokenSource` as a refresh would, at a fixed
/// `now`; the input as a whole token goes through `JWTClaims.expiry` too. A bad token is a
/// `bad_response`, never a trap.
func fuzzFileToken(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let payload = UnsafeBufferPointer(start: data, count: size)
    _ = try? JWTClaims.expiry(of: String(decoding: payload, as: UTF8.self))
    let token = "eyJhbGciOiJub25lIn0." + base64URL(payload) + ".c2ln"
    let descriptor = open(tokenPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    precondition(descriptor >= 0, "cannot write \(tokenPath)")
    let written = token.utf8.withContiguousStorageIfAvailable { write(descriptor, $0.baseAddress, $0.count) } ?? -1
    close(descriptor)
    precondition(written == token.utf8.count, "cannot write \(tokenPath)")
    _ = try? FileTokenSource(configuration: FileSourceConfiguration(path: tokenPath)).read(now: now)
    return 0
}

/// One file per fuzzing process, so that parallel jobs do not share it; in memory where there is
/// a tmpfs for it.
private let tokenPath = (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/token-broker-fuzz-token.\(getpid())"
/// 2023-11-14T22:13:20Z: an `exp` near it is a token with time left.
private let now = WallTime(timeIntervalSince1970: 1_700_000_000)

private func base64URL(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    var out: [UInt8] = []
    var index = 0
    while index < bytes.count {
        let chunk = bytes[index..<min(index + 3, bytes.count)]
        var group: UInt32 = 0
        for (offset, byte) in chunk.enumerated() { group |= UInt32(byte) << (16 - 8 * offset) }
        for position in 0...chunk.count { out.append(alphabet[Int(group >> (18 - 6 * position)) & 63]) }
        index += 3
    }
    return String(decoding: out, as: UTF8.self)
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzFileToken_main")
func fuzzFileTokenMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzFileToken(data!, size) }
}
