import CLibFuzzer
import TokenBrokerCore

/// Any bytes through the JSON parser, which every other reader sits on.
///
/// A document that parses is written out again (strings by `JSONText.quoted`, the broker's own
/// writer) and parsed a second time, and must come back the same: neither the parser nor the
/// writer traps, and the writer's output is JSON the parser reads back unchanged.
func fuzzJSON(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard let value = try? JSONValue(parsing: UnsafeBufferPointer(start: data, count: size)) else { return 0 }
    let text = render(value)
    let again = try? JSONValue(parsing: Array(text.utf8))
    precondition(again == value, "written out as \(text), which does not parse back the same")
    return 0
}

/// JSON text for `value`; numbers as Swift prints a `Double`, which reads back exactly.
private func render(_ value: JSONValue) -> String {
    switch value {
    case .null: "null"
    case .bool(let flag): flag ? "true" : "false"
    case .number(let number): "\(number.value)"
    case .string(let string): JSONText.quoted(string)
    case .array(let items): "[" + items.map(render).joined(separator: ",") + "]"
    case .object(let members):
        "{" + members.map { JSONText.quoted($0.key) + ":" + render($0.value) }.joined(separator: ",") + "}"
    }
}

/// The program's entry point, which runs libFuzzer's driver: SwiftPM links an executable's `main`
/// to `<module>_main`, so libFuzzer's own `main` cannot be used.
@_cdecl("FuzzJSON_main")
func fuzzJSONMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzJSON(data!, size) }
}
