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
// which removes run-time generic-metadata look-ups from the request path, and put each function
// in a section of its own, so that the link order below can move it.
let optimized: [SwiftSetting] = [
    .unsafeFlags(["-cross-module-optimization", "-Xfrontend", "-function-sections"], .when(configuration: .release))
]

// Release binaries are linked by the toolchain's lld, for two savings in resident memory:
// - packed relative relocations (DT_RELR, glibc 2.36 and later): the loader reads 4 KB of them at
//   start instead of 545 KB. The binary stays position-independent.
// - a link order (Sources/token-broker/link-order.txt, written by `make link-order`): the
//   functions run at start, when idle and on common requests sit together, so their pages do not
//   drag in the rest of the text. Functions are compiled into sections of their own for this.
let linkOrder = String(#filePath.dropLast("Package.swift".count)) + "Sources/token-broker/link-order.txt"
let compactLink: [LinkerSetting] = [
    .unsafeFlags([
        "-use-ld=lld", "-Xlinker", "-z", "-Xlinker", "pack-relative-relocs",
        "-Xlinker", "--symbol-ordering-file=\(linkOrder)", "-Xlinker", "--no-warn-symbol-ordering",
    ], .when(configuration: .release))
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
            exclude: ["link-order.txt"],
            swiftSettings: optimized,
            linkerSettings: compactLink
        ),
        .testTarget(
            name: "TokenBrokerCoreTests",
            dependencies: ["TokenBrokerCore"]
        ),
        .testTarget(
            name: "TokenBrokerSourcesTests",
            dependencies: ["TokenBrokerSources", "TokenBrokerCore"]
        ),
        .testTarget(
            name: "token-brokerTests",
            dependencies: ["token-broker", "TokenBrokerCore"]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// Fuzzing (`make fuzz`): a libFuzzer target per input the broker reads from outside, in Fuzz/.
// They exist only when TOKEN_BROKER_FUZZ is set, so that ordinary builds and tests never see
// them; the Makefile sets it and builds them with `-sanitize=fuzzer,address`. libFuzzer brings
// its own `main`, hence `-parse-as-library`; `@testable` reaches internal entry points, hence
// `-enable-testing`.
if Context.environment["TOKEN_BROKER_FUZZ"] != nil {
    let fuzzTargets: [(name: String, dependencies: [Target.Dependency])] = [
        ("FuzzJSON", ["TokenBrokerCore"]),
        ("FuzzConfiguration", ["TokenBrokerCore"]),
        ("FuzzCallerKeys", ["TokenBrokerCore"]),
        ("FuzzTokenAnswer", ["TokenBrokerCore", "TokenBrokerSources"]),
        ("FuzzFileToken", ["TokenBrokerCore", "TokenBrokerSources"]),
        ("FuzzQuery", ["TokenBrokerHTTP"]),
        ("FuzzProxyPath", ["TokenBrokerCore"]),
    ]
    package.targets.append(.systemLibrary(name: "CLibFuzzer", path: "Fuzz/CLibFuzzer"))
    for target in fuzzTargets {
        package.targets.append(.executableTarget(
            name: target.name, dependencies: target.dependencies + ["CLibFuzzer"], path: "Fuzz/Targets/\(target.name)",
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ))
    }
}
