// swift-tools-version:6.0
//
// token-broker: fetches access tokens, keeps a fresh one cached, and serves it over HTTP.
//
// Layers, from the bottom up; each imports only those below it, and the C stays behind
// `internal import`:
//   CMicroHTTPD, COpenSSL, CCurl, CHiredis  system libraries from Debian, each behind a small shim.h
//   CSystem                       system headers Glibc's Swift module leaves out (epoll, eventfd, malloc, xattr)
//   TokenBrokerCore               pure Swift: tokens, configuration, the provider and its rules, metrics
//   TokenBrokerCrypto             hashing, HMAC, random bytes, constant-time comparison (libcrypto)
//   TokenBrokerUpstream           the HTTP client for issuers and proxy targets (libcurl)
//   TokenBrokerSources            where tokens come from (the local JWT signer, upstream issuers, files)
//   TokenBrokerServer             the libmicrohttpd server: listeners, suspended connections, streamed
//                                 bodies; it knows no broker route and no broker error text
//   TokenBrokerAPI                the routes of both listeners on a value-type request, caller keys, and
//                                 every error answer
//   TokenBrokerProxy              proxy mode: requests forwarded with a token, retried once when refused
//   TokenBrokerSinks              token files: each new token of a provider written to a file, atomically,
//                                 never wider than its mode (it renders the JSON format with TokenBrokerAPI)
//   TokenBrokerStore              the token store: records sealed with AES-256-GCM, kept in files (written
//                                 with the sinks' atomic writer) so that tokens outlive a restart, or in
//                                 Redis (hiredis), shared by a fleet that fetches once per refresh
//   token-broker                  the executable: command line, wiring, signals, allocator tuning
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
    .unsafeFlags(
        [
            "-use-ld=lld", "-Xlinker", "-z", "-Xlinker", "pack-relative-relocs",
            "-Xlinker", "--symbol-ordering-file=\(linkOrder)", "-Xlinker", "--no-warn-symbol-ordering",
        ], .when(configuration: .release))
]

let package = Package(
    name: "token-broker",
    products: [
        .executable(name: "token-broker", targets: ["token-broker"])
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
        .systemLibrary(
            name: "CHiredis",
            pkgConfig: "hiredis",
            providers: [.apt(["libhiredis-dev"])]
        ),
        .systemLibrary(name: "CSystem"),
        .target(name: "TokenBrokerCore", swiftSettings: optimized),
        .target(name: "TokenBrokerCrypto", dependencies: ["TokenBrokerCore", "COpenSSL"], swiftSettings: optimized),
        .target(
            name: "TokenBrokerUpstream", dependencies: ["TokenBrokerCore", "CCurl"], swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerSources",
            dependencies: ["TokenBrokerCore", "TokenBrokerCrypto", "TokenBrokerUpstream", "COpenSSL"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerServer",
            dependencies: ["TokenBrokerCore", "CMicroHTTPD", "CSystem"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerAPI",
            dependencies: ["TokenBrokerCore", "TokenBrokerCrypto", "TokenBrokerServer"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerProxy",
            dependencies: ["TokenBrokerCore", "TokenBrokerUpstream", "TokenBrokerServer", "TokenBrokerAPI"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerSinks",
            dependencies: ["TokenBrokerCore", "TokenBrokerCrypto", "TokenBrokerAPI", "CSystem"],
            swiftSettings: optimized
        ),
        .target(
            name: "TokenBrokerStore",
            dependencies: ["TokenBrokerCore", "TokenBrokerCrypto", "TokenBrokerSinks", "CHiredis"],
            swiftSettings: optimized
        ),
        .executableTarget(
            name: "token-broker",
            dependencies: [
                "TokenBrokerCore", "TokenBrokerCrypto", "TokenBrokerUpstream", "TokenBrokerSources",
                "TokenBrokerServer",
                "TokenBrokerAPI", "TokenBrokerProxy", "TokenBrokerSinks", "TokenBrokerStore", "CSystem",
            ],
            exclude: ["link-order.txt"],
            swiftSettings: optimized,
            linkerSettings: compactLink
        ),
        // What the test targets share (the openssl command line, temporary folders, polling, a manual
        // clock, a scripted token source); tests only.
        .target(name: "TokenBrokerTestSupport", dependencies: ["TokenBrokerCore"], path: "Tests/TestSupport"),
        .testTarget(name: "TokenBrokerCoreTests", dependencies: ["TokenBrokerCore", "TokenBrokerTestSupport"]),

        .testTarget(name: "TokenBrokerCryptoTests", dependencies: ["TokenBrokerTestSupport", "TokenBrokerCrypto"]),
        .testTarget(
            name: "TokenBrokerUpstreamTests",
            dependencies: ["TokenBrokerTestSupport", "TokenBrokerUpstream", "TokenBrokerCore"]),
        .testTarget(
            name: "TokenBrokerSourcesTests",
            dependencies: [
                "TokenBrokerSources", "TokenBrokerCrypto", "TokenBrokerUpstream", "TokenBrokerCore",
                "TokenBrokerTestSupport",
            ]
        ),
        .testTarget(
            name: "TokenBrokerServerTests",
            dependencies: [
                "TokenBrokerTestSupport", "TokenBrokerServer", "TokenBrokerCore", "TokenBrokerUpstream", "CMicroHTTPD",
            ]),
        .testTarget(
            name: "TokenBrokerProxyTests",
            dependencies: [
                "TokenBrokerTestSupport", "TokenBrokerProxy", "TokenBrokerAPI", "TokenBrokerUpstream",
                "TokenBrokerCore",
            ]
        ),
        .testTarget(
            name: "TokenBrokerAPITests",
            dependencies: ["TokenBrokerTestSupport", "TokenBrokerAPI", "TokenBrokerServer", "TokenBrokerCore"]),
        .testTarget(
            name: "TokenBrokerSinksTests",
            dependencies: [
                "TokenBrokerTestSupport", "TokenBrokerSinks", "TokenBrokerAPI", "TokenBrokerCrypto", "TokenBrokerCore",
            ]),
        .testTarget(
            name: "TokenBrokerStoreTests",
            dependencies: [
                "TokenBrokerTestSupport", "TokenBrokerStore", "TokenBrokerSinks", "TokenBrokerCrypto",
                "TokenBrokerCore",
            ]),
        .testTarget(
            name: "token-brokerTests",
            dependencies: ["token-broker", "TokenBrokerCore", "TokenBrokerTestSupport"]
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
        ("FuzzTokenAnswer", ["TokenBrokerCore", "TokenBrokerUpstream", "TokenBrokerSources"]),
        ("FuzzFileToken", ["TokenBrokerCore", "TokenBrokerSources"]),
        ("FuzzQuery", ["TokenBrokerAPI", "TokenBrokerServer", "CMicroHTTPD"]),
        ("FuzzProxyPath", ["TokenBrokerProxy"]),
        ("FuzzHeaderLine", ["TokenBrokerServer", "TokenBrokerUpstream"]),
    ]
    package.targets.append(.systemLibrary(name: "CLibFuzzer", path: "Fuzz/CLibFuzzer"))
    for target in fuzzTargets {
        package.targets.append(
            .executableTarget(
                name: target.name, dependencies: target.dependencies + ["CLibFuzzer"],
                path: "Fuzz/Targets/\(target.name)",
                swiftSettings: [.unsafeFlags(["-parse-as-library"])]
            ))
    }
}
