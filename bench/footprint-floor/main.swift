// The floor under the idle-RSS target: a Swift program built like the broker (release,
// static Swift standard library, no Foundation) that links the same Debian libraries and
// starts them the way the broker does at start, then does nothing (hiredis is only linked, as
// in the broker without a Redis store):
//   - libcrypto: a P-256 key generated and one ES256 signature (the embedded default signer);
//   - libcurl: curl_global_init and a multi handle (the upstream client);
//   - libmicrohttpd: two daemons on 127.0.0.1, epoll, the token one with a pool of 2 threads.
// Whatever the broker's idle RSS is above this program's, its own code and data account for.
//
//   swiftc -O -static-stdlib -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs \
//       -I Sources/CMicroHTTPD -I Sources/COpenSSL -I Sources/CCurl -I Sources/CHiredis \
//       bench/footprint-floor/main.swift -o .build/bench/footprint-floor
import CCurl
import CHiredis
import CMicroHTTPD
import COpenSSL
import Glibc

// libcrypto: the embedded default's key and one signature.
guard let key = COpenSSL_generate_ec_key("P-256") else { fatalError("keygen") }
let message = Array("header.payload".utf8)
var signature = [UInt8](repeating: 0, count: 128)
var signatureLength = signature.count
let context = EVP_MD_CTX_new()
guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, key) == 1,
    EVP_DigestSign(context, &signature, &signatureLength, message, message.count) == 1
else { fatalError("sign") }

// hiredis: linked and loaded, not used (the broker connects only with a Redis store).
withExtendedLifetime(redisFree as @convention(c) (UnsafeMutablePointer<redisContext>?) -> Void) {}

// libcurl: the client's global state and its multi handle.
curl_global_init(Int(CURL_GLOBAL_DEFAULT))
let multi = curl_multi_init()

// libmicrohttpd: a token listener and an admin listener.
let handler: MHD_AccessHandlerCallback = { _, _, _, _, _, _, _, _ in CMicroHTTPD_no() }
func start(threads: Int) -> OpaquePointer? {
    var flags = UInt32(MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue)
    flags |= UInt32(MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_TURBO.rawValue)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
            var options: [MHD_OptionItem] = [
                MHD_OptionItem(
                    option: .SOCK_ADDR, value: 0, ptr_value: UnsafeMutableRawPointer(mutating: socketAddress)),
                MHD_OptionItem(option: .CONNECTION_MEMORY_LIMIT, value: 4096, ptr_value: nil),
            ]
            if threads > 1 { options.append(MHD_OptionItem(option: .THREAD_POOL_SIZE, value: threads, ptr_value: nil)) }
            options.append(MHD_OptionItem(option: .END, value: 0, ptr_value: nil))
            return options.withUnsafeMutableBufferPointer {
                CMicroHTTPD_start_daemon(flags, handler, nil, $0.baseAddress)
            }
        }
    }
}
guard start(threads: 2) != nil, start(threads: 1) != nil else { fatalError("daemon") }
print("ready")
fflush(stdout)
while true { pause() }
