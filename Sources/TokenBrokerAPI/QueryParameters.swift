import TokenBrokerCore
import TokenBrokerServer

/// A request the broker refuses, with the answer that says why.
struct BadRequest: Error {
    let answer: ErrorAnswer

    init(_ answer: ErrorAnswer) { self.answer = answer }
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
    private static let requestValueNames = RequestParameter.allCases.map(\.rawValue)

    /// The values of `names`, each given at most once, in one pass over the query (a route's
    /// every request comes through here), by the rules of `query(_:)` and `queryCount(_:)`: a
    /// name's value is that of the first parameter whose whole name matches it without regard to
    /// ASCII case (the empty value for one without `=`), and the name is repeated when more than
    /// one parameter's name, read up to a decoded NUL, matches it.
    static func values(_ names: [String], _ request: HTTPRequest) throws(BadRequest) -> [String?] {
        precondition(names.count <= UInt64.bitWidth, "one bit per name")
        var values = [String?](repeating: nil, count: names.count)
        // Bit i: names[i] was matched once (`seen`), more than once (`repeated`).
        var seen: UInt64 = 0
        var repeated: UInt64 = 0
        for (name, value) in request.query {
            guard let index = index(of: name, in: names) else { continue }
            let bit: UInt64 = 1 << index
            repeated |= seen & bit
            seen |= bit
            if values[index] == nil, name.utf8.count == names[index].utf8.count { values[index] = value ?? "" }
        }
        for index in names.indices where values[index] != nil && repeated & (1 << index) != 0 {
            throw BadRequest(.repeatedParameter(names[index]))
        }
        return values
    }

    /// The index in `names` (each in lowercase) of the name that `name`, read up to a NUL, is,
    /// without regard to ASCII case. Read in place: a route's every request comes through here.
    private static func index(of name: String, in names: [String]) -> Int? {
        if let found = name.utf8.withContiguousStorageIfAvailable({ index(of: $0, in: names) }) { return found }
        return Array(name.utf8).withUnsafeBufferPointer { index(of: $0, in: names) }
    }

    private static func index(of name: UnsafeBufferPointer<UInt8>, in names: [String]) -> Int? {
        let head = name.prefix { $0 != 0 }
        for (index, candidate) in names.enumerated()
        where candidate.utf8.count == head.count
            && head.elementsEqual(candidate.utf8, by: { (0x41...0x5A).contains($0) ? $0 | 0x20 == $1 : $0 == $1 })
        {
            return index
        }
        return nil
    }

    /// The version in `If-None-Match: "3"` (or `W/"3"`); nil when absent or not one of ours.
    static func entityTagVersion(_ header: String?) -> UInt64? {
        guard var text = header?.split(separator: ",").first.map({ Substring($0.trimmingCharacters(in: " \t")) }) else {
            return nil
        }
        if text.hasPrefix("W/") { text = text.dropFirst(2) }
        guard text.count >= 3, text.first == "\"", text.last == "\"" else { return nil }
        return number(text.dropFirst().dropLast())
    }

    private static func single(_ name: String, _ request: HTTPRequest) throws(BadRequest) -> String? {
        guard let value = request.query(name) else { return nil }
        if request.queryCount(name) > 1 {
            throw BadRequest(.repeatedParameter(name))
        }
        return value
    }

    static func number(_ text: some StringProtocol) -> UInt64? {
        guard !text.isEmpty, text.count <= maximumDigits, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
            return nil
        }
        return UInt64(text)
    }
}
