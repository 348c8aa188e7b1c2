import TokenBrokerCore

/// Why a listener could not start: the address and the system's reason.
public struct HTTPServerError: Error, CustomStringConvertible {
    public let address: ListenAddress
    public let reason: String
    public var description: String { "cannot listen on \(address): \(reason)" }
}
