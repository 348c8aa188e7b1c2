/// Where a request stands between calls of the access handler, kept in the one pointer that
/// libmicrohttpd keeps for each request (its request context).
///
/// The pointer encodes the phase, so that a plain request allocates nothing:
/// - null: `.awaitingHead`;
/// - the constant 2, which is no object's address: `.headRead`;
/// - a `RequestState`'s address: `.underway`, or with its lowest bit set: `.targetRead`. Swift
///   objects are at least 8-byte aligned (the runtime itself keeps the low bits of object
///   pointers spare), so that bit is free; `context` checks it.
///
/// A context holding a state owns one reference to it: taken when the state is first stored
/// (`retainingContext`), kept as the phase changes (`context`), given back when the request ends.
enum RequestPhase {
    /// No call yet: the next is the first, with the request's head.
    case awaitingHead
    /// The head is in and nothing else needs keeping (the common case).
    case headRead
    /// A request under the streaming prefix whose target was read, and whose head `begin` has
    /// not seen yet.
    case targetRead(RequestState)
    /// A request with state: a body being buffered or streamed, or a deferred answer.
    case underway(RequestState)

    private static let headReadBits: UInt = 2
    private static let targetReadTag: UInt = 1

    /// The phase a request context holds; a state is borrowed, the context keeps its reference.
    init(_ context: UnsafeMutableRawPointer?) {
        guard let context else {
            self = .awaitingHead
            return
        }
        let bits = UInt(bitPattern: context)
        if bits == Self.headReadBits {
            self = .headRead
            return
        }
        let address = UnsafeRawPointer(bitPattern: bits & ~Self.targetReadTag)!
        let state = Unmanaged<RequestState>.fromOpaque(address).takeUnretainedValue()
        self = bits & Self.targetReadTag == 0 ? .underway(state) : .targetRead(state)
    }

    /// The request context for this phase, for a state that the context already holds.
    var context: UnsafeMutableRawPointer? {
        switch self {
        case .awaitingHead:
            return nil
        case .headRead:
            return UnsafeMutableRawPointer(bitPattern: Self.headReadBits)
        case .targetRead(let state):
            return UnsafeMutableRawPointer(bitPattern: Self.address(of: state) | Self.targetReadTag)
        case .underway(let state):
            return UnsafeMutableRawPointer(bitPattern: Self.address(of: state))
        }
    }

    /// The request context for this phase, for a state stored there for the first time: the
    /// context takes a reference to it.
    var retainingContext: UnsafeMutableRawPointer? {
        if let state { _ = Unmanaged.passRetained(state) }
        return context
    }

    /// The request's state, if it has one.
    var state: RequestState? {
        switch self {
        case .awaitingHead, .headRead: nil
        case .targetRead(let state), .underway(let state): state
        }
    }

    private static func address(of state: RequestState) -> UInt {
        let bits = UInt(bitPattern: Unmanaged.passUnretained(state).toOpaque())
        precondition(bits & targetReadTag == 0 && bits != headReadBits, "an object address is not aligned")
        return bits
    }
}
