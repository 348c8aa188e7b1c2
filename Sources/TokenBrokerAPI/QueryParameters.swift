import TokenBrokerCore
import TokenBrokerServer

/// A request the broker refuses, with the answer that says why.
struct BadRequest: Error {
    let answer: ErrorAnswer

    init(_ answer: ErrorAnswer) { self.answer = answer }
}

/// The names of the query parameters a route reads in one pass (`QueryParameters.values`), each
/// in lowercase, at most `QueryValues.capacity`. Made once per route: their bytes are kept, so
/// that a request's parameter names are matched against them in place.
struct QueryNames: Sendable {
    let names: [String]
    /// Each name's UTF-8, in `names`' order.
    let bytes: [[UInt8]]

    init(_ names: [String]) {
        precondition(names.count <= QueryValues.capacity, "at most \(QueryValues.capacity) names")
        self.names = names
        bytes = names.map { Array($0.utf8) }
    }
}

/// The values `QueryParameters.values` found, by their name's index in its `QueryNames`; nil:
/// not given. Kept as positions in the request's query (plain integers, in a SIMD vector for its
/// subscript), so that reading a route's query allocates nothing and copies no string until a
/// value is read.
struct QueryValues {
    /// The most names a route reads at once (managed identity's seven, and room for one more).
    static let capacity = 8

    private let query: HTTPFields
    /// For each name, the position in `query` of the parameter that gives its value; -1: none.
    private var positions = SIMD8<Int>(repeating: -1)

    init(_ query: HTTPFields) { self.query = query }

    /// The value for the name at `index`: as sent, the empty value for a parameter without `=`.
    subscript(index: Int) -> String? {
        let position = positions[index]
        return position < 0 ? nil : query.value(at: position) ?? ""
    }

    /// Whether the name at `index` was given.
    func isGiven(_ index: Int) -> Bool { positions[index] >= 0 }

    /// Takes the parameter at `position` in the query as the value for the name at `index`.
    mutating func take(_ index: Int, from position: Int) { positions[index] = position }
}

/// Reads and checks the query parameters of the token routes; a bad one is a 400 naming it.
enum QueryParameters {
    /// The largest number a parameter may hold.
    static let maximumDigits = 15

    /// A version such as `after=3`: a whole number from 0; nil when absent.
    static func version(_ name: String, _ request: HTTPRequest) throws(BadRequest) -> UInt64? {
        guard let text = try single(name, request) else { return nil }
        guard let value = number(text) else {
            throw BadRequest(.notAWholeNumber(parameter: name))
        }
        return value
    }

    /// `timeout` in whole seconds, from `minimum`: default 30, at most `maximum` (larger values are capped).
    static func timeout(_ request: HTTPRequest, minimum: UInt64 = 0, maximum: Duration) throws(BadRequest) -> Duration {
        guard let text = try single("timeout", request) else { return min(.seconds(30), maximum) }
        guard let seconds = number(text), seconds >= minimum else {
            throw BadRequest(.invalidTimeout(minimum: minimum))
        }
        // At most `maximumDigits` digits, so it fits an Int64 (checked all the same).
        guard let whole = Int64(exactly: seconds) else { return maximum }
        return min(.seconds(whole), maximum)
    }

    /// The values a request names for a template's child, each as sent (percent-decoded).
    struct RequestValues: Equatable, ExactKey {
        var audience: String?
        var scope: String?
        var resource: String?

        func isExactly(_ other: Self) -> Bool {
            audience.isExactly(other.audience) && scope.isExactly(other.scope) && resource.isExactly(other.resource)
        }

        /// The first parameter named, in `RequestParameter` order; nil when none is.
        var first: RequestParameter? {
            audience != nil ? .audience : scope != nil ? .scope : resource != nil ? .resource : nil
        }
    }

    /// `audience`, `scope` and `resource`, each at most once; what they may hold is for
    /// `TokenRequestValues.checked` to say. One named without `=` (`?audience`) is the empty
    /// value, which `checked` refuses as malformed: it is not the parameter left out, which asks
    /// for the template's default.
    static func requestValues(_ request: HTTPRequest) throws(BadRequest) -> RequestValues {
        // The common request has no query at all.
        guard !request.query.isEmpty else { return RequestValues() }
        let found = try values(requestValueNames, request)
        return RequestValues(audience: found[0], scope: found[1], resource: found[2])
    }

    /// The request values' names, in `RequestParameter` order.
    private static let requestValueNames = QueryNames(RequestParameter.allCases.map(\.rawValue))

    /// `values(_:_:)` for names given as an array, answered as one (for tests; the routes keep
    /// their names as `QueryNames` and read `QueryValues`, which allocate nothing per request).
    static func values(_ names: [String], _ request: HTTPRequest) throws(BadRequest) -> [String?] {
        let found = try values(QueryNames(names), request)
        return names.indices.map { found[$0] }
    }

    /// The values of `names`, each given at most once, in one pass over the query (a route's
    /// every request comes through here), by the rules of `query(_:)` and `queryCount(_:)`: a
    /// name's value is that of the first parameter whose whole name matches it without regard to
    /// ASCII case (the empty value for one without `=`), and the name is repeated when more than
    /// one parameter's name, read up to a decoded NUL, matches it.
    static func values(_ names: QueryNames, _ request: HTTPRequest) throws(BadRequest) -> QueryValues {
        var values = QueryValues(request.query)
        // Bit i: names[i] was matched once (`seen`), more than once (`repeated`).
        var seen: UInt8 = 0
        var repeated: UInt8 = 0
        request.query.forEachName { position, name in
            guard let (index, whole) = match(name, in: names) else { return true }
            let bit: UInt8 = 1 << index
            repeated |= seen & bit
            seen |= bit
            if whole, !values.isGiven(index) { values.take(index, from: position) }
            return true
        }
        for index in names.names.indices where values.isGiven(index) && repeated & (1 << index) != 0 {
            throw BadRequest(.repeatedParameter(names.names[index]))
        }
        return values
    }

    /// The index in `names` of the name that `name`, read up to a NUL, is, without regard to
    /// ASCII case, and whether that is the whole of `name` (no NUL in it). Read in place: a
    /// route's every request comes through here.
    private static func match(_ name: UnsafeBufferPointer<UInt8>, in names: QueryNames) -> (index: Int, whole: Bool)? {
        let length = name.firstIndex(of: 0) ?? name.count
        for (index, candidate) in names.bytes.enumerated() where candidate.count == length {
            var equal = true
            for offset in 0..<length where name[offset].asciiLowercased != candidate[offset] {
                equal = false
                break
            }
            if equal { return (index, length == name.count) }
        }
        return nil
    }

    /// What `If-None-Match` says the client has: the highest of its entity tags that are ours
    /// (`"3"` or `W/"3"`), and whether it holds `*` (any version). Every line of the header is
    /// read, as one list: a client may split a list across lines (RFC 9110 §5.3). Nil when the
    /// request has none.
    static func entityTags(_ request: HTTPRequest) -> EntityTags? {
        var tags: EntityTags?
        request.forEachHeader(named: "If-None-Match") { line in
            tags = tags ?? EntityTags()
            tags?.read(line)
        }
        return tags
    }

    /// The version one `If-None-Match` line says the client has, as `EntityTags.version`; nil
    /// when absent.
    static func entityTagVersion(_ header: String?, current: () -> UInt64?) -> UInt64? {
        guard let header else { return nil }
        var tags = EntityTags()
        tags.read(header)
        return tags.version(current: current)
    }

    /// The entity tags of an `If-None-Match` list that the broker can read.
    struct EntityTags: Equatable {
        /// The highest version among the tags that are ours; nil: none is.
        var highest: UInt64?
        /// The list holds `*`.
        var any = false

        /// Adds the members of `list` (one line of the header).
        mutating func read(_ list: String) {
            for member in list.split(separator: ",") {
                var text = Substring(member.trimmingCharacters(in: " \t"))
                if text == "*" {
                    any = true
                    continue
                }
                if text.hasPrefix("W/") { text = text.dropFirst(2) }
                guard text.count >= 3, text.first == "\"", text.last == "\"",
                    let version = QueryParameters.number(text.dropFirst().dropLast())
                else { continue }
                highest = max(highest ?? 0, version)
            }
        }

        /// The version the client has: the highest of its tags, since the condition is false
        /// when any of them is current (RFC 9110 §13.1.2); with `*`, at least `current`, the
        /// version held now (when there is one). Nil when none of its tags is one of ours.
        func version(current: () -> UInt64?) -> UInt64? {
            guard any, let now = current() else { return highest }
            return max(highest ?? 0, now)
        }
    }

    /// The value of the parameter `name`, given at most once (by `queryCount`'s reading); nil
    /// when it is not given. One given without `=` (`?after`), or under a name that only reads
    /// as `name` up to a NUL, is the empty value, which no reader takes: it is not the
    /// parameter left out, and whether a later `after=6` counts must not depend on the order.
    private static func single(_ name: String, _ request: HTTPRequest) throws(BadRequest) -> String? {
        switch request.queryCount(name) {
        case 0: return nil
        case 1: return request.query(name) ?? ""
        default: throw BadRequest(.repeatedParameter(name))
        }
    }

    static func number(_ text: some StringProtocol) -> UInt64? {
        guard !text.isEmpty, text.count <= maximumDigits, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
            return nil
        }
        return UInt64(text)
    }
}
