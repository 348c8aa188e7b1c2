import Testing
import TokenBrokerCore

@testable import TokenBrokerServer

/// `HTTPFields` keeps a request's fields as bytes in one block: what it reads back must be what
/// went in, and its look-ups must answer as the plain reading of the same fields as strings does
/// (`HTTPServerTests` checks the same against libmicrohttpd over a socket).
@Suite struct HTTPFieldsTests {
    /// Names and values that test the block's arithmetic: empty ones, none, ones longer than a
    /// small string, a NUL inside, bytes beyond ASCII, and a name repeated in other case.
    static let fields: [(String, String?)] = [
        ("a", "1"), ("Flag", nil), ("", ""), ("long-name-over-fifteen-bytes", "a value over fifteen bytes long"),
        ("x\u{0}y", "v\u{0}w"), ("é", "ü"), ("FLAG", "second"), ("x", nil), ("X", "3"),
    ]

    @Test func readsBackEveryNameAndValueInOrder() {
        let read = HTTPFields(Self.fields)
        #expect(read.count == Self.fields.count && !read.isEmpty)
        #expect(read.pairs.map(\.name) == Self.fields.map(\.0))
        #expect(read.pairs.map(\.value) == Self.fields.map(\.1))
        for (index, field) in Self.fields.enumerated() {
            #expect(read.name(at: index) == field.0 && read.value(at: index) == field.1)
            #expect(read.withName(at: index) { Array($0) } == Array(field.0.utf8))
        }
    }

    @Test func noFieldsReadAsNone() {
        for empty in [HTTPFields(), HTTPFields([])] {
            #expect(empty.isEmpty && empty.count == 0 && empty.pairs.isEmpty)
            #expect(empty.firstIndex(named: "a") == nil && empty.count(namedUpToNUL: "a") == 0)
        }
    }

    @Test(arguments: [
        "a", "A", "flag", "FLAG", "", "LONG-NAME-OVER-FIFTEEN-BYTES", "x", "x\u{0}y", "É", "é", "y", "fla",
    ])
    func findsAndCountsNamesAsTheStringReadingDoes(_ name: String) {
        let read = HTTPFields(Self.fields)
        let expectedIndex = Self.fields.firstIndex { $0.0.equalsIgnoringASCIICase(name) }
        let expectedCount = Self.fields.count { $0.0.prefix { $0 != "\u{0}" }.equalsIgnoringASCIICase(name) }
        #expect(read.firstIndex(named: name) == expectedIndex)
        #expect(read.count(namedUpToNUL: name) == expectedCount)
        // Every field of the whole name, in order, the first of them the one `firstIndex` finds.
        var found: [Int] = []
        read.forEachIndex(named: name) { found.append($0) }
        #expect(found == Self.fields.indices.filter { Self.fields[$0].0.equalsIgnoringASCIICase(name) })
        #expect(found.first == expectedIndex)
    }

    @Test func aRequestsLookupsReadItsFields() {
        let request = HTTPRequest(
            method: "GET", path: "/", query: Self.fields, headers: [("Host", "h"), ("X-Empty", ""), ("x-empty", "2")])
        #expect(request.query("FLAG") == nil, "the first Flag has no value")
        #expect(request.query("x") == nil && request.query("a") == "1" && request.queryCount("x") == 3)
        #expect(request.header("x-EMPTY") == "" && request.header("host") == "h" && request.header("none") == nil)
        // A header sent as several lines: every line's value, in order.
        var values: [String] = []
        request.forEachHeader(named: "X-EMPTY") { values.append($0) }
        #expect(values == ["", "2"])
        request.forEachHeader(named: "none") { values.append($0) }
        #expect(values == ["", "2"])
    }
}
