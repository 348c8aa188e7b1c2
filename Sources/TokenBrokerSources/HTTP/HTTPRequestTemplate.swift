import TokenBrokerCore
import TokenBrokerUpstream

/// The http source's configured request cut at its placeholders, once for a template and all its
/// children, and filled in with one child's values at each fetch.
///
/// Each value is encoded for where it stands (see `HTTPSourceConfiguration`): percent-encoded in
/// the URL; in the body, form-encoded, JSON-string-escaped or as is by the configured
/// `Content-Type`; as is in a header value, where a control character is refused.
struct HTTPRequestTemplate: Sendable {
    /// A header value: a text with placeholders, or a file read at every fetch (never filled in).
    enum HeaderValue: Sendable {
        case text(PlaceholderText)
        case file(String)
    }

    let url: PlaceholderText
    /// By name, in name order.
    let headers: [(name: String, value: HeaderValue)]
    let body: PlaceholderText
    let bodyEncoding: HTTPSourceConfiguration.BodyEncoding
    /// The parameters the placeholders use, in order: each must be named.
    let required: [RequestParameter]

    init(_ configuration: HTTPSourceConfiguration) throws(TokenFetchError) {
        func parsed(_ text: String, _ key: String) throws(TokenFetchError) -> PlaceholderText {
            do {
                return try PlaceholderText(parsing: text)
            } catch {
                throw .configuration("\(key): \(error.description)")
            }
        }
        url = try parsed(configuration.url, "url")
        var headers: [(name: String, value: HeaderValue)] = []
        for (name, value) in configuration.headers.sorted(by: { $0.key < $1.key }) {
            switch value {
            case .value(let text): headers.append((name, .text(try parsed(text, "headers." + name))))
            case .file(let path): headers.append((name, .file(path)))
            }
        }
        self.headers = headers
        body = try parsed(configuration.body ?? "", "body")
        bodyEncoding = configuration.bodyEncoding
        var required = url.parameters.union(body.parameters)
        for case (_, .text(let text)) in headers { required.formUnion(text.parameters) }
        self.required = required.sorted()
    }

    /// The request with `values` put in. A placeholder has no default: a value not named is refused
    /// (the routes and sinks refuse it first, see `ProviderConfiguration.requiredParameters`),
    /// never sent empty, which would ask for what no allow-list allowed.
    func request(values: TokenRequestValues, configuration: HTTPSourceConfiguration) throws(TokenFetchError)
        -> UpstreamRequest
    {
        if let missing = required.first(where: { values.value($0) == nil }) {
            throw .configuration("the \(missing.rawValue) is not named, and the source's placeholders have no default")
        }
        var headers: [(String, String)] = [("Accept", "application/json")]
        for (name, value) in self.headers {
            switch value {
            case .text(let text):
                for parameter in text.parameters {
                    guard let value = values.value(parameter), value.utf8.contains(where: Self.isControl) else {
                        continue
                    }
                    throw .configuration("the \(parameter.rawValue) holds a control character; it cannot go in \(name)")
                }
                headers.append((name, text.filled { values.value($0) ?? "" }))
            case .file(let path):
                // The client leaves out a header that holds NUL (a line break `readLine` refuses):
                // a file holding one, or any other control character but tab, is an error, never
                // a header silently not sent.
                let value = try SecretFile.readLine(path)
                guard !value.utf8.contains(where: { $0 != 0x09 && Self.isControl($0) }) else {
                    throw .configuration("\(path) holds a control character; it cannot go in \(name)")
                }
                headers.append((name, value))
            }
        }
        let body = self.body.filled { parameter in
            let value = values.value(parameter) ?? ""
            switch bodyEncoding {
            case .form: return FormEncoding.escape(value)
            case .json: return String(JSONText.quoted(value).dropFirst().dropLast())
            case .asIs: return value
            }
        }
        // Blanks around a value are no part of it (RFC 9110 §5.5). A header configured empty, or
        // blank, is not sent, nor one of libcurl's own under its name (as it always was): only
        // the proxy sends empty values, as its clients sent them.
        headers = headers.map { ($0.0, $0.1.trimmingCharacters(in: " \t")) }
        var request = UpstreamRequest(
            method: configuration.method, url: url.filled { FormEncoding.percentEncoded(values.value($0) ?? "") },
            headers: headers.filter { !$0.1.isEmpty }, body: Array(body.utf8), settings: configuration.upstream)
        request.withheld = headers.filter { $0.1.isEmpty }.map(\.0)
        return request
    }

    private static func isControl(_ byte: UInt8) -> Bool { byte < 0x20 || byte == 0x7F }
}
