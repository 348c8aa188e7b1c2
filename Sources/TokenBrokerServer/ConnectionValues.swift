internal import CMicroHTTPD

/// Copies a request's headers or query parameters out of its libmicrohttpd connection, in the
/// order sent, with their lengths (so that a decoded NUL stays in a query value).
enum ConnectionValues {
    /// The request's headers (a header without a value reads as empty).
    static func headers(_ connection: OpaquePointer) -> [(String, String)] {
        collect(connection, .HEADER_KIND).map { ($0.0, $0.1 ?? "") }
    }

    /// The request's query parameters, percent-decoded; nil for a parameter without `=`.
    static func query(_ connection: OpaquePointer) -> [(String, String?)] {
        collect(connection, .GET_ARGUMENT_KIND)
    }

    private static func collect(_ connection: OpaquePointer, _ kind: MHD_ValueKind) -> [(String, String?)] {
        // Without an iterator libmicrohttpd only counts: most requests have no query, and the
        // headers' array is then allocated once, at its size.
        let count = Int(MHD_get_connection_values_n(connection, kind, nil, nil))
        guard count > 0 else { return [] }
        var collected: [(String, String?)] = []
        collected.reserveCapacity(count)
        withUnsafeMutablePointer(to: &collected) { pointer in
            _ = MHD_get_connection_values_n(
                connection, kind,
                { cls, _, key, keyLength, value, valueLength in
                    guard let cls, let key else { return CMicroHTTPD_yes() }
                    let list = cls.assumingMemoryBound(to: [(String, String?)].self)
                    list.pointee.append(
                        (ConnectionValues.text(key, keyLength), value.map { ConnectionValues.text($0, valueLength) }))
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
