/// A generic JSON token endpoint, `source.type: "http"`, for WAF-like and in-house token services,
/// with the placeholders a template's child fills in (`PlaceholderText`).
///
/// ## Placeholders
///
/// In a template (a provider with `perRequest`), `url`, inline header values and `body` may hold
/// `{{audience}}`, `{{scope}}` and `{{resource}}`: each is replaced by the child's value, encoded
/// for where it stands, so that no value can leave its place:
/// - in `url`: percent-encoded, all but RFC 3986's unreserved characters (`A–Z a–z 0–9 - . _ ~`),
///   so `/`, `?`, `&`, `=`, `#` and a space arrive as `%2F`, `%3F`, `%26`, `%3D`, `%23`, `%20`.
///   A placeholder may stand in the path, the query or the fragment, not in the scheme or host;
/// - in `body`, by the configured `Content-Type` header: `application/x-www-form-urlencoded`, or
///   no `Content-Type` at all (the form type is then what is sent), form-encoded as above with a
///   space as `+`; `application/json` or any `…+json` type, escaped as within a JSON string,
///   without quotes added (write `"aud": "{{audience}}"`): there a placeholder must stand inside
///   a JSON string literal, which is checked at start; any other type, as is;
/// - in a header value: as is. Values are visible ASCII; a scope set is its tokens joined by
///   single spaces.
///
/// A placeholder has no default: every request, and every sink, for the template's children must
/// name each parameter the placeholders use, or is refused (400 `invalid_request`; a sink at
/// start) without a fetch (`ProviderConfiguration.requiredParameters`). `{{` always opens a
/// placeholder: an unknown name, an unclosed `{{`, or a placeholder for a parameter missing from
/// the provider's `perRequest` is refused at start, naming the key. A placeholder in the
/// `Content-Type` value, or in a header name, is refused too.
///
/// ```json
/// {"name": "waf", "perRequest": ["audience", "scope"],
///  "allowedAudiences": ["https://*"], "allowedScopes": ["read", "write"],
///  "source": {"type": "http", "url": "https://tokens.example/issue?aud={{audience}}",
///             "headers": {"Content-Type": "application/json", "X-Scope": "{{scope}}"},
///             "body": "{\"audience\": \"{{audience}}\", \"scope\": \"{{scope}}\"}"}}
/// ```
/// A request for `?audience=https://orders.example&scope=read%20write` then sends
/// `…/issue?aud=https%3A%2F%2Forders.example`, `X-Scope: read write` and
/// `{"audience": "https://orders.example", "scope": "read write"}`.
public struct HTTPSourceConfiguration: Sendable, Equatable {
    /// How placeholders in `body` are encoded, chosen by the configured `Content-Type`.
    public enum BodyEncoding: Sendable, Equatable {
        /// `application/x-www-form-urlencoded`, also when no `Content-Type` is configured.
        case form
        /// `application/json` or a `+json` type: escaped as inside a JSON string.
        case json
        /// Any other type: the value as is.
        case asIs
    }

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

    /// Headers that frame the request or the connection: libcurl sets them for what it sends.
    static let setByTheClient: Set<String> = [
        "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade", "expect",
    ]

    /// A byte no header value may hold: a control character other than tab, or DEL.
    static func isControl(_ byte: UInt8) -> Bool { (byte < 0x20 && byte != 0x09) || byte == 0x7F }

    init(reading reader: inout ObjectReader) throws(ConfigurationError) {
        guard let url = try reader.string("url") else {
            throw ConfigurationError(
                key: reader.keyPath("url"), "is required with type \"http\"; allowed: the token service's URL")
        }
        try UpstreamConfiguration.checkURL(url, key: reader.keyPath("url"))
        self.init(url: url)
        method = try reader.choice("method", ["GET", "POST"], default: method)
        if var headerReader = try reader.object("headers") {
            for (name, value) in try headerReader.allMembers() {
                let key = headerReader.keyPath(name)
                // A name with a placeholder is refused below, with its own reason.
                guard
                    name.isHTTPToken || (name.contains(bytes: "{{") && name.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F })
                else {
                    throw ConfigurationError(
                        key: key,
                        "is not a header name; allowed: letters, digits and !#$%&'*+-.^_`|~ (an RFC 9110 token)")
                }
                if Self.setByTheClient.contains(name.lowercased()) {
                    throw ConfigurationError(
                        key: key,
                        "frames the request, which the client library sets for what it sends; it cannot be configured")
                }
                switch value {
                // Byte by byte: as Characters, "\r\n" is one that equals neither "\r" nor "\n". The
                // client leaves out a header whose value holds CR, LF or NUL, so such a value would
                // never be sent; no other control character belongs in a header either (RFC 9110 §5.5).
                case .string(let text) where !text.utf8.contains(where: Self.isControl):
                    headers[name] = .value(text)
                case .object(let members) where members.count == 1:
                    guard case .string(let path)? = members["file"] else { fallthrough }
                    headers[name] = .file(path)
                default:
                    throw ConfigurationError(
                        key: key, "must be a string without control characters (tab aside), or {\"file\": \"/path\"}")
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

    /// The configured `Content-Type` header, found whatever its case.
    private var contentType: HeaderValue? {
        headers.sorted { $0.key < $1.key }.first { $0.key.lowercased() == "content-type" }?.value
    }

    /// How placeholders in `body` are encoded: by the media type of the configured `Content-Type`
    /// (parameters such as `charset` aside); `form` without one, since the form type is then what
    /// goes out with a body; `asIs` for a type read from a file, which cannot hold a placeholder.
    public var bodyEncoding: BodyEncoding {
        switch contentType {
        case nil: return .form
        case .file?: return .asIs
        case .value(let text)?:
            let mediaType = text.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0]
                .trimmingCharacters(in: " \t").lowercased()
            if mediaType == "application/x-www-form-urlencoded" { return .form }
            if mediaType == "application/json" || mediaType.hasSuffix("+json") { return .json }
            return .asIs
        }
    }

    /// The parameters the placeholders of `url`, inline header values and `body` use: those a
    /// request must name, since a placeholder has no default. A text whose placeholders cannot be
    /// read (refused at start by `checkPlaceholders`) adds none.
    public var placeholderParameters: Set<RequestParameter> {
        var texts = [url]
        if let body { texts.append(body) }
        for case .value(let text) in headers.values { texts.append(text) }
        var parameters: Set<RequestParameter> = []
        for text in texts where text.contains(bytes: "{{") {
            if let parsed = try? PlaceholderText(parsing: text) { parameters.formUnion(parsed.parameters) }
        }
        return parameters
    }

    /// Checks the placeholders of `url`, header values and `body` against the provider's
    /// `perRequest`; `key` is the source's path, such as `providers[0].source`.
    func checkPlaceholders(perRequest: Set<RequestParameter>, key: String) throws(ConfigurationError) {
        func checked(_ text: String, _ key: String) throws(ConfigurationError) -> PlaceholderText {
            let parsed: PlaceholderText
            do {
                parsed = try PlaceholderText(parsing: text)
            } catch {
                throw ConfigurationError(key: key, error.description)
            }
            if let missing = parsed.parameters.sorted().first(where: { !perRequest.contains($0) }) {
                throw ConfigurationError(
                    key: key,
                    "{{\(missing.rawValue)}} needs \"\(missing.rawValue)\" in the provider's perRequest"
                        + (perRequest.isEmpty ? " (a provider without perRequest takes no placeholder)" : ""))
            }
            return parsed
        }
        let url = try checked(self.url, key + ".url")
        if !url.parameters.isEmpty, !url.placeholdersFollowTheAuthority {
            throw ConfigurationError(
                key: key + ".url",
                "a placeholder may stand in the path, query or fragment, not in the scheme or host")
        }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) {
            let headerKey = key + ".headers." + name
            if name.contains(bytes: "{{") {
                throw ConfigurationError(key: headerKey, "placeholders are replaced in header values, not in names")
            }
            guard case .value(let text) = value else { continue }
            let parsed = try checked(text, headerKey)
            if name.lowercased() == "content-type", !parsed.parameters.isEmpty {
                throw ConfigurationError(
                    key: headerKey, "Content-Type decides how placeholders in the body are encoded: it cannot hold one")
            }
        }
        guard let body else { return }
        let parsedBody = try checked(body, key + ".body")
        guard !parsedBody.parameters.isEmpty else { return }
        if case .file? = contentType {
            throw ConfigurationError(
                key: key + ".body",
                "placeholders in the body need Content-Type given inline, which decides how they are encoded")
        }
        if bodyEncoding == .json, !parsedBody.placeholdersStandInJSONStrings {
            throw ConfigurationError(
                key: key + ".body",
                "with a JSON Content-Type, a placeholder must stand inside a JSON string"
                    + #" ("aud": "{{audience}}"), where its value is escaped"#)
        }
    }
}

/// A text of the http source (`url`, a header value, `body`) cut at its placeholders:
/// `{{audience}}`, `{{scope}}` and `{{resource}}`, the names of `RequestParameter`.
///
/// `{{` always opens a placeholder; a lone `}}` is text, so JSON bodies need no escaping.
public struct PlaceholderText: Sendable, Equatable {
    /// A piece of the text: as written, or a placeholder.
    public enum Part: Sendable, Equatable {
        case text(String)
        case placeholder(RequestParameter)
    }

    /// The pieces, in order; adjacent text is one piece.
    public let parts: [Part]

    /// Cuts `text` at its placeholders; throws for an unknown name or an unclosed `{{`.
    ///
    /// Works on the UTF-8 bytes: `{` and `}` are ASCII, so every cut falls between scalars.
    public init(parsing text: String) throws(PlaceholderProblem) {
        let bytes = Array(text.utf8)
        let brace = (open: UInt8(ascii: "{"), close: UInt8(ascii: "}"))
        func pair(_ byte: UInt8, at index: Int) -> Bool {
            index + 1 < bytes.count && bytes[index] == byte && bytes[index + 1] == byte
        }
        var parts: [Part] = []
        var textStart = 0
        var index = 0
        while index < bytes.count {
            guard pair(brace.open, at: index) else {
                index += 1
                continue
            }
            var close = index + 2
            while close < bytes.count, !pair(brace.close, at: close) { close += 1 }
            guard close < bytes.count else {
                throw PlaceholderProblem(
                    description: "\"{{\" opens a placeholder that is never closed; allowed: \(Self.allowedNames)")
            }
            let name = String(decoding: bytes[(index + 2)..<close], as: UTF8.self)
            guard let parameter = RequestParameter(rawValue: name) else {
                let shown = name.utf8.count > 40 ? String(decoding: name.utf8.prefix(40), as: UTF8.self) + "…" : name
                throw PlaceholderProblem(
                    description: "unknown placeholder {{\(shown)}}; allowed: \(Self.allowedNames)")
            }
            if textStart < index { parts.append(.text(String(decoding: bytes[textStart..<index], as: UTF8.self))) }
            parts.append(.placeholder(parameter))
            index = close + 2
            textStart = index
        }
        if textStart < bytes.count { parts.append(.text(String(decoding: bytes[textStart...], as: UTF8.self))) }
        self.parts = parts
    }

    /// The parameters the text names.
    public var parameters: Set<RequestParameter> {
        Set(parts.compactMap { if case .placeholder(let parameter) = $0 { parameter } else { nil } })
    }

    /// The text with each placeholder replaced by `value(parameter)`, already encoded for its place.
    public func filled(_ value: (RequestParameter) -> String) -> String {
        var out = ""
        for part in parts {
            switch part {
            case .text(let text): out += text
            case .placeholder(let parameter): out += value(parameter)
            }
        }
        return out
    }

    /// Whether every placeholder stands inside a JSON string literal, and not just after a
    /// backslash: what a JSON body needs, since a value is put in escaped as string content.
    ///
    /// Follows the text's string state: a `"` outside a string opens one; inside, a backslash
    /// escapes the next byte and an unescaped `"` closes it. A placeholder does not change the
    /// state, since its value is string content. The rest of the JSON is the issuer's to judge.
    var placeholdersStandInJSONStrings: Bool {
        var inString = false
        var escaped = false
        for part in parts {
            switch part {
            case .placeholder:
                guard inString, !escaped else { return false }
            case .text(let text):
                for byte in text.utf8 {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = inString
                    } else if byte == UInt8(ascii: "\"") {
                        inString.toggle()
                    }
                }
            }
        }
        return true
    }

    /// Whether every placeholder of a URL comes after its authority: the text before the first
    /// one holds `://` and, after it, the `/`, `?` or `#` that ends the host.
    var placeholdersFollowTheAuthority: Bool {
        guard case .text(let prefix)? = parts.first, let scheme = prefix.firstRange(ofBytes: "://") else {
            return false
        }
        return prefix[scheme.upperBound...].contains { $0 == "/" || $0 == "?" || $0 == "#" }
    }

    private static let allowedNames = RequestParameter.allCases.map { "{{\($0.rawValue)}}" }.joined(separator: ", ")
}

/// Why a text's placeholders cannot be read.
public struct PlaceholderProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
}
