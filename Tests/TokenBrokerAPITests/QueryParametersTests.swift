// The request values of a template's child as the query names them: which parameter is which,
// and when one counts as given twice.
import Testing
import TokenBrokerServer

@testable import TokenBrokerAPI

@Suite struct QueryParametersTests {
    private func values(_ query: [(String, String?)]) -> Result<QueryParameters.RequestValues, BadRequest> {
        Result { () throws(BadRequest) in
            try QueryParameters.requestValues(HTTPRequest(method: "GET", path: "/token", query: query))
        }
    }

    private func repeated(_ query: [(String, String?)]) -> String? {
        guard case .failure(let refusal) = values(query), case .repeatedParameter(let name) = refusal.answer else {
            return nil
        }
        return name
    }

    @Test func namesAreMatchedWithoutRegardToASCIICaseAndOthersAreIgnored() throws {
        let named = try values([
            ("AUDIENCE", "https://a.example"), ("Scope", "read write"), ("resource", "urn:r"), ("audiences", "x"),
            ("audienc", "y"), ("after", "3"),
        ]).get()
        #expect(named.audience == "https://a.example")
        #expect(named.scope == "read write")
        #expect(named.resource == "urn:r")
        let none = try values([("timeout", "5"), ("scopes", "a")]).get()
        #expect(none.audience == nil && none.scope == nil && none.resource == nil)
    }

    @Test func aNameWithoutEqualsSignIsTheEmptyValueNotLeftOut() throws {
        let named = try values([("audience", nil), ("resource", "")]).get()
        #expect(named.audience == "")
        #expect(named.resource == "")
        #expect(named.scope == nil)
    }

    @Test func aNameGivenTwiceInAnyCaseOrCutAtANULIsRefused() {
        #expect(repeated([("audience", "a"), ("AUDIENCE", "b")]) == "audience")
        #expect(repeated([("scope", "a"), ("scope", nil)]) == "scope")
        // `audience%00x=b`, decoded: C reads the name as `audience`, so the value is named twice.
        #expect(repeated([("audience\u{0}x", "b"), ("audience", "a")]) == "audience")
        #expect(repeated([("resource", "a"), ("resource\u{0}", "b")]) == "resource")
        // The first parameter at fault, in the order audience, scope, resource.
        #expect(repeated([("scope", "a"), ("scope", "b"), ("audience", "x"), ("audience", "y")]) == "audience")
    }

    @Test func aNameCutAtANULAloneIsNotTheParameter() throws {
        let named = try values([("audience\u{0}", "a"), ("scope\u{0}evil", "b")]).get()
        #expect(named.audience == nil)
        #expect(named.scope == nil)
    }

    @Test func anyNamesAreReadInOnePassWithTheSameRulesUnderscoresAndDigitsIncluded() throws {
        let request = HTTPRequest(
            method: "GET", path: "/msi/token",
            query: [("API-Version", "2019-08-01"), ("CLIENT_ID", "c"), ("client_iD", nil), ("mi_res_id", "r")])
        // `client_id` given twice (in two cases) is refused; `_` is not a letter to fold.
        #expect(throws: BadRequest.self) { try QueryParameters.values(["api-version", "client_id"], request) }
        let named = try QueryParameters.values(["api-version", "mi_res_id", "msi_res_id", "mi\u{7F}res_id"], request)
        #expect(named == ["2019-08-01", "r", nil, nil])
    }
}
