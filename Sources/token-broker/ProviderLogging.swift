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
                // Any caller can ask as fast as it likes once the window is used up: one line a
                // second at most, counted in the metrics all the same.
                guard let notLogged = excessiveRefreshLog.admit(name, at: ContinuousClock.now) else { return }
                if notLogged == 0 {
                    Log.warning("forced refresh refused: too many in the window", ["provider": name])
                } else {
                    Log.warning(
                        "forced refresh refused: too many in the window",
                        ["provider": name, "not_logged": String(notLogged)])
                }
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
            refusedFromFleet: { name, record, problem in
                metrics.recordStoreOperation("record", result: "refused")
                let message = "token from the fleet refused; fetching"
                let version = String(record.version)
                let fingerprint = Fingerprint.of(record.accessToken)
                if let child {
                    Log.warning(
                        message,
                        [
                            "provider": name, "values": child.description, "version": version,
                            "token": fingerprint, "problem": problem,
                        ])
                } else {
                    Log.warning(
                        message, ["provider": name, "version": version, "token": fingerprint, "problem": problem])
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
                guard let notLogged = refusalLog.admit(at: ContinuousClock.now) else { return }
                Log.warning(
                    "template child refused: maxChildren reached (further refusals this second not logged)",
                    ["provider": name, "values": values.description, "not_logged": String(notLogged)])
            })
    }
}

/// One log line per second at most for the refusals past `maxChildren`, which are counted in the
/// metrics, not all logged.
private let refusalLog = LogThrottle(interval: .seconds(1))
/// The same for forced refreshes refused past the window, per provider: a client flooding one
/// provider's window must not hide another's refusals.
private let excessiveRefreshLog = KeyedLogThrottle(interval: .seconds(1))

/// Lets one event through per `interval`, for events a client can cause as often as it likes
/// (a log line each would let it flood the log), and counts the ones it holds back.
final class LogThrottle: Sendable {
    private let interval: Duration
    private let state = Lock<(last: ContinuousClock.Instant?, heldBack: Int)>((nil, 0))

    init(interval: Duration) { self.interval = interval }

    /// nil when the event at `now` is held back (none may be logged within `interval` of the
    /// last one); else how many were held back since the last one let through.
    func admit(at now: ContinuousClock.Instant) -> Int? {
        state.withLock { state in
            if let previous = state.last, previous.duration(to: now) < interval {
                state.heldBack += 1
                return nil
            }
            defer { state = (now, 0) }
            return state.heldBack
        }
    }
}

/// A `LogThrottle` per key (a provider's name: configured, so their number is bounded).
final class KeyedLogThrottle: Sendable {
    private let interval: Duration
    private let throttles = Lock<[String: LogThrottle]>([:])

    init(interval: Duration) { self.interval = interval }

    /// `LogThrottle.admit` for `key`'s events.
    func admit(_ key: String, at now: ContinuousClock.Instant) -> Int? {
        let throttle = throttles.withLock { throttles in
            if let known = throttles[key] { return known }
            let made = LogThrottle(interval: interval)
            throttles[key] = made
            return made
        }
        return throttle.admit(at: now)
    }
}
