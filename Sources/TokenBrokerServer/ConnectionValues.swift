internal import CMicroHTTPD

/// Copies a request's headers or query parameters out of its libmicrohttpd connection, in the
/// order sent, with their lengths (so that a decoded NUL stays in a query value).
enum ConnectionValues {
    /// The request's headers.
    static func headers(_ connection: OpaquePointer) -> [(String, String)] {
        collect(connection, .HEADER_KIND)
    }

    /// The request's query parameters, percent-decoded.
    static func query(_ connection: OpaquePointer) -> [(String, String)] {
        collect(connection, .GET_ARGUMENT_KIND)
    }

    private static func collect(_ connection: OpaquePointer, _ kind: MHD_ValueKind) -> [(String, String)] {
        var collected: [(String, String)] = []
        withUnsafeMutablePointer(to: &collected) { pointer in
            _ = MHD_get_connection_values_n(
                connection, kind,
                { cls, _, key, keyLength, value, valueLength in
                    guard let cls, let key else { return CMicroHTTPD_yes() }
                    let list = cls.assumingMemoryBound(to: [(String, String)].self)
                    list.pointee.append(
                        (
                            ConnectionValues.text(key, keyLength),
                            value.map { ConnectionValues.text($0, valueLength) } ?? ""
                        ))
                    return CMicroHTTPD_yes()
                }, pointer)
        }
        return collected
    }

    fileprivate static func text(_ pointer: UnsafePointer<CChar>, _ length: Int) -> String {
        pointer.withMemoryRebound(to: UInt8.self, capacity: length) {
            String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
        }
    }
}
