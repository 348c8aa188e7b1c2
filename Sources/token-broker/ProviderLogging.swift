import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSources

/// What a provider reports, written to the log and counted in the metrics.
extension ProviderEvents {
    /// Events that log each fetch (a fingerprint of the token, never the token) and each refused
    /// forced refresh, and record each fetch, with the issuer's HTTP status, in `metrics`.
    static func logged(recordingIn metrics: BrokerMetrics) -> ProviderEvents {
        ProviderEvents(
            fetched: { name, result, elapsed in
                metrics.recordFetch(provider: name, error: result.failure, duration: elapsed)
                switch result {
                case .success(let (token, version)):
                    if let status = token.upstreamStatus { metrics.recordUpstreamStatus(provider: name, code: status) }
                    Log.info(
                        "token fetched",
                        [
                            "provider": name, "version": String(version), "token": Fingerprint.of(token.accessToken),
                            // Whole seconds, the fraction dropped: a token that lives 59.6 s logs 59.
                            "lifetime_s": token.lifetime.map { String($0.components.seconds) } ?? "none",
                            "took_ms": String(elapsed.wholeMilliseconds),
                        ])
                case .failure(let error):
                    Log.warning(
                        "token fetch failed", ["provider": name, "error": error.description, "detail": error.detail])
                }
            },
            excessiveRefresh: { name in
                Log.warning("forced refresh refused: too many in the window", ["provider": name])
            })
    }
}
