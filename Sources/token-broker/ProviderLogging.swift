import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSources

/// What a provider reports, written to the log and counted in the metrics.
extension ProviderEvents {
    /// Events that log each fetch (a fingerprint of the token, never the token) and each refused
    /// forced refresh, and record each fetch, with the issuer's HTTP status, in `metrics`.
    /// - Parameter child: a template's child's values, which its log lines add (quoted) to the
    ///   template's name; the metrics count the child under the template's name alone.
    static func logged(recordingIn metrics: BrokerMetrics, child: TokenRequestValues? = nil) -> ProviderEvents {
        ProviderEvents(
            fetched: { name, result, elapsed in
                metrics.recordFetch(provider: name, error: result.failure, duration: elapsed)
                switch result {
                case .success(let (token, version)):
                    if let status = token.upstreamStatus { metrics.recordUpstreamStatus(provider: name, code: status) }
                    let fingerprint = Fingerprint.of(token.accessToken)
                    // Whole seconds, the fraction dropped: a token that lives 59.6 s logs 59.
                    let lifetime = token.lifetime.map { String($0.components.seconds) } ?? "none"
                    let took = String(elapsed.wholeMilliseconds)
                    if let child {
                        Log.info(
                            "token fetched",
                            [
                                "provider": name, "values": child.description, "version": String(version),
                                "token": fingerprint, "lifetime_s": lifetime, "took_ms": took,
                            ])
                    } else {
                        Log.info(
                            "token fetched",
                            [
                                "provider": name, "version": String(version), "token": fingerprint,
                                "lifetime_s": lifetime,
                                "took_ms": took,
                            ])
                    }
                case .failure(let error):
                    if let child {
                        Log.warning(
                            "token fetch failed",
                            [
                                "provider": name, "values": child.description, "error": error.description,
                                "detail": error.detail,
                            ])
                    } else {
                        Log.warning(
                            "token fetch failed",
                            ["provider": name, "error": error.description, "detail": error.detail])
                    }
                }
            },
            excessiveRefresh: { name in
                Log.warning("forced refresh refused: too many in the window", ["provider": name])
            },
            storeLoaded: { name, load, served in
                switch load {
                case .found(let record):
                    metrics.recordStoreOperation("load", result: served ? "served" : "expired")
                    let message = served ? "stored token served" : "stored token expired; fetching"
                    let version = String(record.version)
                    let fingerprint = Fingerprint.of(record.accessToken)
                    if let child {
                        Log.info(
                            message,
                            [
                                "provider": name, "values": child.description, "version": version,
                                "token": fingerprint,
                            ])
                    } else {
                        Log.info(message, ["provider": name, "version": version, "token": fingerprint])
                    }
                case .missing:
                    metrics.recordStoreOperation("load", result: "missing")
                case .refused(let reason):
                    metrics.recordStoreOperation("load", result: "refused")
                    let message = "stored record refused; fetching"
                    if let child {
                        Log.warning(message, ["provider": name, "values": child.description, "problem": reason])
                    } else {
                        Log.warning(message, ["provider": name, "problem": reason])
                    }
                }
            },
            fromFleet: { name, record in
                metrics.recordStoreOperation("record", result: "from_fleet")
                let version = String(record.version)
                let fingerprint = Fingerprint.of(record.accessToken)
                if let child {
                    Log.info(
                        "token from the fleet",
                        ["provider": name, "values": child.description, "version": version, "token": fingerprint])
                } else {
                    Log.info("token from the fleet", ["provider": name, "version": version, "token": fingerprint])
                }
            },
            fetchedFor: { _, origin in
                switch origin {
                case .fetchedForFleet: metrics.recordStoreFetch(for: "fleet")
                case .fetchedAlone: metrics.recordStoreFetch(for: "alone")
                case .fromFleet: break
                }
            })
    }
}

/// What a template reports of its children, written to the log and counted in the metrics.
extension TemplateEvents {
    /// Events that log each child made, dropped or refused, with the values it was made for
    /// (the caller's choice, not secrets: quoted, never a metric label), and count drops and refusals.
    static func logged(recordingIn metrics: BrokerMetrics) -> TemplateEvents {
        TemplateEvents(
            made: { name, values in
                Log.info("template child made", ["provider": name, "values": values.description])
            },
            dropped: { name, values in
                metrics.recordChildDropped(template: name)
                Log.info(
                    "template child dropped: idle for childIdleSec", ["provider": name, "values": values.description])
            },
            refused: { name, values in
                metrics.recordChildRefused(template: name)
                // A caller can ask for new values as fast as it likes: one line a second at most.
                guard refusalLog.admit(at: ContinuousClock.now) else { return }
                Log.warning(
                    "template child refused: maxChildren reached (further refusals this second not logged)",
                    ["provider": name, "values": values.description])
            })
    }
}

/// Admits one log line per second: the refusals past `maxChildren` are counted, not all logged.
private let refusalLog = LogThrottle(interval: .seconds(1))

/// Lets one event through per `interval`.
final class LogThrottle: Sendable {
    private let interval: Duration
    private let last = Lock<ContinuousClock.Instant?>(nil)

    init(interval: Duration) { self.interval = interval }

    /// Whether an event at `now` may be logged: none was in the `interval` before it.
    func admit(at now: ContinuousClock.Instant) -> Bool {
        last.withLock { last in
            if let previous = last, previous.duration(to: now) < interval { return false }
            last = now
            return true
        }
    }
}
