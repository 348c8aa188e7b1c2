/// The token as a cookie, with the WAF SDK's keys (`setTokenCookie`, `tokenCookieName`,
/// `domainName`, `tokenCookiePath`), which sit directly in a provider's configuration.
public struct CookieSettings: Sendable, Equatable {
    /// Add `cookie` and `set_cookie` to token answers. Default false.
    public var setTokenCookie: Bool = false
    /// The cookie's name. Default `aws-waf-token`; an RFC 6265 token.
    public var tokenCookieName: String = "aws-waf-token"
    /// The `Domain` attribute. Default: none (a host-only cookie).
    public var domainName: String?
    /// The `Path` attribute. Default `/`.
    public var tokenCookiePath: String = "/"

    public init() {}

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        setTokenCookie = try reader.bool("setTokenCookie", default: setTokenCookie)
        tokenCookieName = try reader.string("tokenCookieName", default: tokenCookieName)
        domainName = try reader.string("domainName")
        tokenCookiePath = try reader.string("tokenCookiePath", default: tokenCookiePath)
        let separators = Set("()<>@,;:\\\"/[]?={} \t")
        guard !tokenCookieName.isEmpty,
            tokenCookieName.unicodeScalars.allSatisfy({
                $0.value > 0x20 && $0.value < 0x7F && !separators.contains(Character($0))
            })
        else {
            throw ConfigurationError(
                key: reader.keyPath("tokenCookieName"),
                "\"\(tokenCookieName)\" is not a cookie name; allowed: visible ASCII without separators")
        }
        // RFC 6265 §4.1.1: a `Domain` is a host name. A blank or a comma would end the attribute
        // early in the browser's reading or in a proxy that joins `Set-Cookie` lines with commas.
        if let domainName,
            domainName.isEmpty || domainName.utf8.count > 253
                || !domainName.utf8.allSatisfy({
                    switch $0 {
                    case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, UInt8(ascii: "-"), UInt8(ascii: "."): true
                    default: false
                    }
                })
        {
            throw ConfigurationError(
                key: reader.keyPath("domainName"), "must be a host name: ASCII letters, digits, \"-\" and \".\"")
        }
        guard
            tokenCookiePath.utf8.allSatisfy({
                $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ";") && $0 != UInt8(ascii: ",")
            })
        else {
            throw ConfigurationError(
                key: reader.keyPath("tokenCookiePath"), "must be visible ASCII without \";\" and \",\"")
        }
        guard tokenCookiePath.hasPrefix("/") else {
            throw ConfigurationError(key: reader.keyPath("tokenCookiePath"), "must start with \"/\"")
        }
    }

    /// `name=value`, ready for a `Cookie:` header; nil when the token is not a cookie value
    /// (`TokenRules.isCookieValue`: a `;` in it would end the cookie and start another).
    public func cookieHeader(token: String) -> String? {
        TokenRules.isCookieValue(token) ? "\(tokenCookieName)=\(token)" : nil
    }

    /// A `Set-Cookie` line whose `Max-Age` matches the token's remaining life; nil when the
    /// token is not a cookie value (`Domain=` or `Max-Age=` in it would set attributes).
    public func setCookieHeader(token: String, maxAge: Int?) -> String? {
        guard var line = cookieHeader(token: token) else { return nil }
        if let domainName { line += "; Domain=\(domainName)" }
        line += "; Path=\(tokenCookiePath)"
        if let maxAge { line += "; Max-Age=\(maxAge)" }
        return line + "; Secure; HttpOnly; SameSite=Lax"
    }
}
