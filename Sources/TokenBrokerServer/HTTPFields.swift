internal import CMicroHTTPD
import TokenBrokerCore

/// A request's header fields or query parameters, in the order sent, as bytes: names as sent,
/// header values without the whitespace around them, query names and values percent-decoded by
/// libmicrohttpd (a decoded NUL stays in them).
///
/// Every field's name and value are copied out of libmicrohttpd in one block, with no string
/// made until a route asks for one: a request reads a few of its fields, and most routes compare
/// them as bytes (`firstIndex(named:)`, `withName(at:_:)`). Making each name and value a `String`
/// up front cost about a tenth of a cached `/token` answer's instructions (2,500 of 24,800): a
/// UTF-8 check for each, an allocation for each longer than 15 bytes, and the same again to free
/// them.
///
/// The block is one allocation: a `Place` per field (16 bytes: where its name and value start and
/// how long they are), then the names' and values' bytes. A value's length of `UInt32.max` says
/// the field has none (a query parameter without `=`).
public struct HTTPFields: Sendable {
    /// The block; nil when there are no fields. Written once as it is made and only read after,
    /// so it may be read from any thread (`ManagedBuffer` is not `Sendable`, so its subclass
    /// cannot say so itself).
    private nonisolated(unsafe) let block: Block?
    /// How many fields there are.
    public let count: Int

    /// The block's memory (its header: its size). A class of its own rather than a `[UInt8]`:
    /// making an array of a size known only at run time looks up its storage's type each time,
    /// some 360 instructions.
    private final class Block: ManagedBuffer<Int, UInt8> {}

    private struct Place {
        var nameStart: UInt32
        var nameCount: UInt32
        var valueStart: UInt32
        var valueCount: UInt32

        static let size = 16
        static let noValue = UInt32.max
    }

    /// No fields.
    public init() {
        block = nil
        count = 0
    }

    /// These fields, in this order (nil: no value); for handlers that make requests, and tests.
    public init(_ fields: [(String, String?)]) {
        self.init(
            count: fields.count,
            byteCount: fields.reduce(0) { $0 + $1.0.utf8.count + ($1.1?.utf8.count ?? 0) }
        ) { index, add in
            fields[index].0.withUTF8Bytes { name in
                if let value = fields[index].1 {
                    value.withUTF8Bytes { add(UnsafeRawBufferPointer(name), UnsafeRawBufferPointer($0)) }
                } else {
                    add(UnsafeRawBufferPointer(name), nil)
                }
            }
        }
    }

    /// Fills one block: `field(i, add)` calls `add` with the `i`th field's name and value (nil:
    /// none), whose lengths add up, over all fields, to `byteCount`.
    private init(
        count: Int, byteCount: Int,
        _ field: (Int, (UnsafeRawBufferPointer, UnsafeRawBufferPointer?) -> Void) -> Void
    ) {
        self.count = count
        guard count > 0 else {
            block = nil
            return
        }
        let placesSize = count * Place.size
        let size = placesSize + byteCount
        precondition(size < Int(UInt32.max), "fields beyond 4 GiB")
        let block = unsafeDowncast(Block.create(minimumCapacity: size) { _ in size }, to: Block.self)
        self.block = block
        block.withUnsafeMutablePointerToElements { elements in
            let base = UnsafeMutableRawBufferPointer(start: elements, count: size)
            var next = placesSize
            func copy(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
                let start = next
                precondition(start + bytes.count <= size, "the fields' lengths changed while they were copied")
                if let source = bytes.baseAddress, !bytes.isEmpty {
                    (base.baseAddress! + start).copyMemory(from: source, byteCount: bytes.count)
                }
                next += bytes.count
                return UInt32(start)
            }
            for index in 0..<count {
                field(index) { name, value in
                    let nameStart = copy(name)
                    let valueStart = value.map(copy) ?? 0
                    let place = Place(
                        nameStart: nameStart, nameCount: UInt32(name.count), valueStart: valueStart,
                        valueCount: value.map { UInt32($0.count) } ?? Place.noValue)
                    base.storeBytes(of: place, toByteOffset: index * Place.size, as: Place.self)
                }
            }
            precondition(next == size, "the fields' lengths changed while they were copied")
        }
    }

    public var isEmpty: Bool { count == 0 }

    /// Calls `body` with the field at `index`'s place and the block's bytes.
    private func withField<Result>(
        _ index: Int, _ body: (Place, UnsafePointer<UInt8>) throws -> Result
    ) rethrows -> Result {
        guard let block, index >= 0, index < count else { preconditionFailure("field index out of range") }
        return try block.withUnsafeMutablePointerToElements { elements in
            let place = UnsafeRawPointer(elements).loadUnaligned(fromByteOffset: index * Place.size, as: Place.self)
            return try body(place, elements)
        }
    }

    /// Calls `body` with the bytes of the field at `index`'s name, read in place.
    public func withName<Result>(at index: Int, _ body: (UnsafeBufferPointer<UInt8>) throws -> Result) rethrows
        -> Result
    {
        try withField(index) { place, bytes in
            try body(UnsafeBufferPointer(start: bytes + Int(place.nameStart), count: Int(place.nameCount)))
        }
    }

    /// Calls `body` with each field's position and name, in order, read in place; `body` says
    /// whether to go on.
    public func forEachName(_ body: (Int, UnsafeBufferPointer<UInt8>) throws -> Bool) rethrows {
        guard let block else { return }
        try block.withUnsafeMutablePointerToElements { elements in
            for index in 0..<count {
                let place = UnsafeRawPointer(elements).loadUnaligned(
                    fromByteOffset: index * Place.size, as: Place.self)
                guard
                    try body(
                        index, UnsafeBufferPointer(start: elements + Int(place.nameStart), count: Int(place.nameCount)))
                else { return }
            }
        }
    }

    /// The name of the field at `index`, as sent.
    public func name(at index: Int) -> String {
        withName(at: index) { String(decoding: $0, as: UTF8.self) }
    }

    /// Calls `body` with the bytes of the field at `index`'s value, read in place; nil when it
    /// has none (a query parameter without `=`).
    public func withValue<Result>(at index: Int, _ body: (UnsafeBufferPointer<UInt8>?) throws -> Result) rethrows
        -> Result
    {
        try withField(index) { place, bytes in
            try body(
                place.valueCount == Place.noValue
                    ? nil : UnsafeBufferPointer(start: bytes + Int(place.valueStart), count: Int(place.valueCount)))
        }
    }

    /// The value of the field at `index`; nil when it has none (a query parameter without `=`).
    public func value(at index: Int) -> String? {
        withField(index) { place, bytes in
            guard place.valueCount != Place.noValue else { return nil }
            return String(
                decoding: UnsafeBufferPointer(start: bytes + Int(place.valueStart), count: Int(place.valueCount)),
                as: UTF8.self)
        }
    }

    /// The position of the first field whose whole name is `name`, ASCII letters compared
    /// without regard to case (RFC 9110 §5.1; and libmicrohttpd's look-up of a query parameter).
    public func firstIndex(named name: String) -> Int? {
        name.withUTF8Bytes { wanted in
            var found: Int?
            forEachName { index, name in
                if Self.equalIgnoringCase(name, wanted) { found = index }
                return found == nil
            }
            return found
        }
    }

    /// Calls `body` with the position of every field whose whole name is `name`, compared as
    /// `firstIndex(named:)` compares, in the order sent: a header whose value is a list may be
    /// sent as several lines, which together are the one list (RFC 9110 §5.3).
    public func forEachIndex(named name: String, _ body: (Int) -> Void) {
        name.withUTF8Bytes { wanted in
            forEachName { index, name in
                if Self.equalIgnoringCase(name, wanted) { body(index) }
                return true
            }
        }
    }

    /// How many fields have the name `name` when each is read up to its first NUL, as C reads
    /// it, ASCII letters compared without regard to case.
    public func count(namedUpToNUL name: String) -> Int {
        name.withUTF8Bytes { wanted in
            var matches = 0
            forEachName { _, name in
                let upToNUL = UnsafeBufferPointer(rebasing: name[..<(name.firstIndex(of: 0) ?? name.count)])
                if Self.equalIgnoringCase(upToNUL, wanted) { matches += 1 }
                return true
            }
            return matches
        }
    }

    /// Every field as a name and a value (nil: none), in the order sent.
    public var pairs: [(name: String, value: String?)] {
        (0..<count).map { (name(at: $0), value(at: $0)) }
    }

    private static func equalIgnoringCase(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        for index in 0..<a.count where a[index] != b[index] && a[index].asciiLowercased != b[index].asciiLowercased {
            return false
        }
        return true
    }
}

extension HTTPFields {
    /// The fields of `kind` (headers, or the query's parameters) that libmicrohttpd read for the
    /// request on `connection`, valid until it is answered. A header without a value reads as
    /// empty; a query parameter without `=`, as having none.
    init(_ connection: OpaquePointer, _ kind: MHD_ValueKind) {
        // Without an iterator libmicrohttpd only counts: most requests have no query at all.
        let expected = Int(MHD_get_connection_values_n(connection, kind, nil, nil))
        guard expected > 0 else {
            self.init()
            return
        }
        let isHeader = kind == .HEADER_KIND
        self = withUnsafeTemporaryAllocation(of: RawField.self, capacity: expected) { found in
            var collected = Collected(fields: found.baseAddress!, capacity: expected)
            withUnsafeMutablePointer(to: &collected) { pointer in
                _ = MHD_get_connection_values_n(connection, kind, rawFieldVisitor, pointer)
            }
            // libmicrohttpd drops the whitespace before a header's value but keeps what follows
            // it, which is not part of the value (RFC 9110 §5.5): `Token-Broker-Request: true<TAB>`
            // is `true`.
            if isHeader {
                for index in 0..<collected.count { found[index].valueCount = found[index].trimmedValueCount }
            }
            let fields = UnsafeBufferPointer(rebasing: found[..<collected.count])
            return HTTPFields(
                count: fields.count,
                byteCount: fields.reduce(0) { $0 + $1.nameCount + ($1.value == nil ? 0 : $1.valueCount) }
            ) { index, add in
                let field = fields[index]
                let value = field.value.map { UnsafeRawBufferPointer(start: $0, count: field.valueCount) }
                add(
                    UnsafeRawBufferPointer(start: field.name, count: field.nameCount),
                    value ?? (isHeader ? UnsafeRawBufferPointer(start: nil, count: 0) : nil))
            }
        }
    }

    /// A field as libmicrohttpd hands it over: pointers into its copy of the request.
    fileprivate struct RawField {
        var name: UnsafeRawPointer
        var nameCount: Int
        var value: UnsafeRawPointer?
        var valueCount: Int

        /// The value's length without the spaces and tabs that end it.
        var trimmedValueCount: Int {
            guard let value else { return valueCount }
            return HTTPSyntax.countWithoutTrailingBlanks(UnsafeRawBufferPointer(start: value, count: valueCount))
        }
    }

    /// The iterator's context: the fields found so far, at most as many as were counted.
    fileprivate struct Collected {
        let fields: UnsafeMutablePointer<RawField>
        let capacity: Int
        var count = 0
    }
}

// libmicrohttpd's value iterator: the context is an `HTTPFields.Collected`.
private let rawFieldVisitor: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
    guard let cls, let key else { return CMicroHTTPD_yes() }
    let collected = cls.assumingMemoryBound(to: HTTPFields.Collected.self)
    guard collected.pointee.count < collected.pointee.capacity else { return CMicroHTTPD_no() }
    (collected.pointee.fields + collected.pointee.count).initialize(
        to: HTTPFields.RawField(
            name: UnsafeRawPointer(key), nameCount: keySize, value: value.map(UnsafeRawPointer.init),
            valueCount: valueSize))
    collected.pointee.count += 1
    return CMicroHTTPD_yes()
}
