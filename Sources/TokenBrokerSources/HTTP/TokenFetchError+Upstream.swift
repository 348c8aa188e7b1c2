import TokenBrokerCore
import TokenBrokerUpstream

/// The upstream client's failures, classified as fetch failures for the sources that use it.
extension TokenFetchError {
    /// The fetch failure an issuer exchange that gave no answer amounts to.
    public init(_ error: UpstreamError) {
        switch error {
        case .clientFailure(let detail): self = .internalError(detail)
        case .settingsRefused: self = .configuration(UpstreamError.settingsRefusedDetail)
        case .unreadableFile(let detail): self = .configuration(detail)
        case .unreachable(let detail): self = .unreachable(detail)
        case .timeout(let detail): self = .timeout(detail)
        case .tooLarge(let limit): self = .badResponse("the answer is larger than \(limit) bytes")
        case .badResponse(let detail): self = .badResponse(detail)
        case .stopped: self = .internalError("stopped")
        }
    }
}

extension UpstreamHTTPClient {
    /// Sends one request to an issuer; a failure is classified as a fetch failure.
    func fetch(_ request: UpstreamRequest) async throws(TokenFetchError) -> UpstreamResponse {
        do {
            return try await send(request)
        } catch {
            throw TokenFetchError(error)
        }
    }
}
