import CLibFuzzer
import TokenBrokerCore
import TokenBrokerUpstream

@testable import TokenBrokerSources

/// An issuer's answer, read as the `oauth2` and `http` sources read it.
///
/// The first byte picks the HTTP status; the bytes up to the first newline are the `Retry-After`
/// header and the rest is the body. Every answer is a token or a classified error, never a trap,
/// and a token that comes out is one the broker can serve; the body with secrets hidden shows
/// none of them.
func fuzzTokenAnswer(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard let first = bytes.first else { return 0 }
    let rest = bytes.dropFirst()
    let newline = rest.firstIndex(of: 10) ?? rest.startIndex
    let retryAfter = String(decoding: rest[rest.startIndex..<newline], as: UTF8.self)
    let body = Array(rest[(newline == rest.startIndex ? newline : newline + 1)...])
    let status = statuses[Int(first) % statuses.count]
    let response = UpstreamResponse(
        status: status, headers: ["retry-after": retryAfter, "content-type": "application/json"], body: body)
    _ = response.retryAfter(now: now)
    // An error's words pass through the secrets' hiding, which walks the text every way it may
    // spell a secret (secrets with `%`, a space and non-ASCII make it branch): no secret comes
    // out whole.
    let hidden = String(decoding: body, as: UTF8.self).hiding(secrets)
    precondition(!secrets.contains { hidden.contains(bytes: $0) }, "a secret shown")
    _ = try? TokenEndpointAnswer.oauthToken(response, defaultLifetime: 3600, now: now, hiding: secrets)
    if let token = try? TokenEndpointAnswer.oauthToken(response, defaultLifetime: 3600, now: now) {
        precondition(TokenEndpointAnswer.isUsableToken(token.accessToken), "served an unusable token")
    }
    if case .object(let members)? = try? JSONValue(parsing: body) {
        for (name, value) in members { _ = try? TokenEndpointAnswer.seconds(value, name: name, status: status) }
    }
    return 0
}

private let secrets = ["50%dis/count k3y", "p\u{E4}ss %2 word", "a b"]
private let statuses = [200, 201, 204, 301, 400, 401, 403, 404, 429, 500, 502, 503, 599, 100, 0, -1, 999]
/// 2023-11-14T22:13:20Z, so that a `Retry-After` date is read against a fixed instant.
private let now = WallTime(timeIntervalSince1970: 1_700_000_000)

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzTokenAnswer_main")
func fuzzTokenAnswerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzTokenAnswer(data!, size) }
}
