/// A generic JSON token endpoint, `source.type: "http"`, for WAF-like and in-house token services.
public struct HTTPSourceConfiguration: Sendable, Equatable {
    /// A header value, given inline or read from a file at every fetch.
    public enum HeaderValue: Sendable, Equatable {
        case value(String)
        case file(String)
    }

    /// Required.
    public var url: String
    /// `GET` or `POST`. Default `POST`.
    public var method: String = "POST"
    /// Request headers; a value may be `{"file": "/path"}`.
    public var headers: [String: HeaderValue] = [:]
    /// The request body, sent as given. Default: none.
    public var body: String?
    /// Where the token is in the answer (RFC 6901). Default `/access_token`.
    public var tokenPointer: String = "/access_token"
    /// Where the lifetime in seconds is. Default: none.
    public var expiresInPointer: String?
    /// Where the expiry is, as seconds since 1970. Default: none.
    public var expiresAtPointer: String?
    /// The lifetime when the answer gives none and the token is not a JWT with `exp`. Default: none (no expiry); 1–86400.
    public var defaultLifetimeSec: Int?
    public var upstream = UpstreamConfiguration()

    public init(url: String) { self.url = url }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let url = try reader.string("url") else {
            throw ConfigurationError(
                key: reader.keyPath("url"), "is required with type \"http\"; allowed: the token service's URL")
        }
        try UpstreamConfiguration.checkURL(url, key: reader.keyPath("url"))
        self.init(url: url)
        method = try reader.choice("method", ["GET", "POST"], default: method)
        if var headerReader = try reader.object("headers") {
            for (name, value) in headerReader.allMembers() {
                let key = headerReader.keyPath(name)
                guard !name.isEmpty, name.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F && $0 != ":" })
                else {
                    throw ConfigurationError(key: key, "is not a header name")
                }
                switch value {
                case .string(let text) where !text.contains(where: { $0 == "\r" || $0 == "\n" }):
                    headers[name] = .value(text)
                case .object(let members) where members.count == 1:
                    guard case .string(let path)? = members["file"] else { fallthrough }
                    headers[name] = .file(path)
                default:
                    throw ConfigurationError(key: key, "must be a string without CR or LF, or {\"file\": \"/path\"}")
                }
            }
        }
        body = try reader.string("body")
        tokenPointer = try reader.string("tokenPointer", default: tokenPointer)
        expiresInPointer = try reader.string("expiresInPointer")
        expiresAtPointer = try reader.string("expiresAtPointer")
        for (key, pointer) in [
            ("tokenPointer", tokenPointer), ("expiresInPointer", expiresInPointer ?? ""),
            ("expiresAtPointer", expiresAtPointer ?? ""),
        ]
        where !pointer.isEmpty && !pointer.hasPrefix("/") {
            throw ConfigurationError(
                key: reader.keyPath(key),
                "\(JSONText.quoted(pointer)) is not a JSON Pointer; allowed: \"\" or a path such as /data/token")
        }
        if expiresInPointer != nil, expiresAtPointer != nil {
            throw ConfigurationError(
                key: reader.keyPath("expiresAtPointer"), "give at most one of expiresInPointer and expiresAtPointer")
        }
        defaultLifetimeSec = try reader.int("defaultLifetimeSec", 1...86_400)
        upstream = try UpstreamConfiguration(reading: &reader)
    }
}
