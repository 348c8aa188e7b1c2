// swift-tools-version:6.0
//
// token-broker: fetches access tokens, keeps a fresh one cached, and serves it over HTTP.
//
// Layers, from the bottom up:
//   CMicroHTTPD, COpenSSL, CCurl  system libraries from Debian, each behind a small shim.h
//   TokenBrokerCore               pure Swift: tokens, configuration, the provider and its rules
//   TokenBrokerSources            where tokens come from (the local JWT signer, upstream issuers)
//   TokenBrokerHTTP               the libmicrohttpd server and the HTTP API on top of it
//   TokenBrokerProxy              proxy mode: requests forwarded with a token, retried once when refused
//   token-broker                  the executable: command line, wiring, signals
//
// No outside Swift packages: the toolchain and Debian's C libraries are all it needs.
import PackageDescription

// Release builds specialise generic code across modules (the provider is generic over its clock),
// which removes run-time generic-metadata look-ups from the request path.
let optimized: [SwiftSetting] = [.unsafeFlags(["-cross-module-optimization"], .when(configuration: .release))]

// Release binaries are linked by the toolchain's lld with packed relative relocations (DT_RELR,
// glibc 2.36 and later): the loader reads 4 KB of them at start instead of 545 KB, pages that
// otherwise stay resident. The binary stays position-independent.
let packedRelocations: [LinkerSetting] = [
    .unsafeFlags(["-use-ld=lld", "-Xlinker", "-z", "-Xlinker", "pack-relative-relocs"], .when(configuration: .release))
]

let package = Package(
    name: "token-broker",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "token-broker", targets: ["token-broker"]),
    ],
    targets: [
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        .target(name: "TokenBrokerCore", swiftSettings: optimized),
        .target(
            name: "TokenBrokerSources",
            dependencies: ["TokenBrokerCore", "COpenSSL", "CCurl"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerHTTP",
            dependencies: ["TokenBrokerCore", "CMicroHTTPD"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerProxy",
            dependencies: ["TokenBrokerCore", "TokenBrokerSources", "TokenBrokerHTTP"],
            swiftSettings: optimized
        ),
        .executableTarget(
            name: "token-broker",
            dependencies: ["TokenBrokerCore", "TokenBrokerSources", "TokenBrokerHTTP", "TokenBrokerProxy"],
            swiftSettings: optimized,
            linkerSettings: packedRelocations
        ),
        .testTarget(
            name: "TokenBrokerCoreTests",
            dependencies: ["TokenBrokerCore"]
        ),
        .testTarget(
            name: "TokenBrokerSourcesTests",
            dependencies: ["TokenBrokerSources", "TokenBrokerCore"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
