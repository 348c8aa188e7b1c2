import TokenBrokerCore
import TokenBrokerServer

/// The token routes' guard against browsers and naive SSRF, the lesson of cloud metadata servers.
///
/// A request must carry `Token-Broker-Request: true`, which a browser cannot add to a simple
/// cross-site request and a URL-fetching bug cannot add at all; and it must carry neither
/// `X-Forwarded-For` nor `Forwarded` (RFC 7239), which mark a request relayed by a proxy.
/// Operators can turn it off with `"requestGuard": false`.
enum RequestGuard {
    static let headerName = "Token-Broker-Request"

    /// Nil when the request may pass, else the 403 to send.
    ///
    /// One pass over the headers, names told apart by length before any byte is compared: every
    /// token route's request comes through here.
    static func check(_ request: HTTPRequest) -> ErrorAnswer? {
        var relayed = false
        var guardHeader: Int?
        request.headers.forEachName { index, name in
            switch name.count {
            case 9, 15:
                relayed = matches(name, "forwarded") || matches(name, "x-forwarded-for")
            case 20:
                if guardHeader == nil, matches(name, "token-broker-request") { guardHeader = index }
            default: break
            }
            return !relayed
        }
        if relayed { return .forwardedRequest }
        guard let guardHeader, request.headers.withValue(at: guardHeader, { sameText(utf8: $0, "true") }) else {
            return .missingRequestHeader
        }
        return nil
    }

    /// Whether `name` is `lowercase` without regard to ASCII case; a `StaticString`'s bytes are
    /// constant data, read without an array.
    private static func matches(_ name: UnsafeBufferPointer<UInt8>, _ lowercase: StaticString) -> Bool {
        let known = UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount)
        guard known.count == name.count else { return false }
        for index in name.indices where name[index].asciiLowercased != known[index] { return false }
        return true
    }
}
