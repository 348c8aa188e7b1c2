import Synchronization

/// The broker's counters and histograms, rendered in the Prometheus text format 0.0.4.
///
/// Labels take only bounded values (route names, status codes, provider names, error
/// classifications), never a path or anything a client chose. Gauges that describe providers
/// (seconds to expiry, waiters, state) are read from `ProviderStatus` at scrape time.
///
/// Locking: `state` and each `RequestCounter`'s own lock are never held together: `render`
/// copies `state` and releases it before it reads the counters and calls the `observe…` readers.
public final class BrokerMetrics: Sendable {
    /// Refresh-latency histogram bounds, in seconds.
    public static let latencyBuckets: [Double] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

    private struct Histogram {
        var counts = [Int](repeating: 0, count: BrokerMetrics.latencyBuckets.count)
        var total = 0
        var sum = 0.0
    }

    private struct State {
        var counters: [RouteKey: RequestCounter] = [:]
        var refreshes: [Labels: Int] = [:]
        var latency: [String: Histogram] = [:]
        var upstreamCodes: [Labels: Int] = [:]
        var staleServed: [String: Int] = [:]
        var excessive: [String: Int] = [:]
        var openConnections: [(listener: String, read: @Sendable () -> Int)] = []
        var evictedConnections: [(listener: String, read: @Sendable () -> Int)] = []
        var waiting: [(listener: String, read: @Sendable () -> (waiting: Int, refused: Int))] = []
        /// Waits refused for a caller key's share, by listener.
        var keyWaitsRefused: [String: Int] = [:]
        var droppedResponseHeaders: (@Sendable () -> Int)?
        var proxied: [Labels: Int] = [:]
        var proxyRetries: [String: Int] = [:]
        var proxyRefreshes: [String: Int] = [:]
        var childrenRefused: [String: Int] = [:]
        var childrenDropped: [String: Int] = [:]
        var sinkWrites: [Labels: Int] = [:]
        var storeOperations: [Labels: Int] = [:]
        var storeFetches: [String: Int] = [:]
        var storeHealth: (@Sendable () -> (reachable: Bool, secondsSinceReachable: Double?))?
        /// Every result from the start, so that a rate over the series is defined before the first reload.
        var reloads: [String: Int] = Dictionary(uniqueKeysWithValues: BrokerMetrics.reloadResults.map { ($0, 0) })
    }

    /// The key of a route's request counter.
    private struct RouteKey: Hashable {
        var listener: String
        var route: String
    }

    /// The key of a two-label counter: whose (a provider or a proxy), and what (a result or a status code).
    private struct Labels: Hashable {
        var owner: String
        var value: String
    }

    private let state = Lock(State())
    private let version: String

    public init(version: String) { self.version = version }

    // MARK: - Recording

    /// One answered request. `route` is a route's name, such as `/token/ready`, never the raw path.
    public func recordRequest(listener: String, route: String, status: Int) {
        counter(listener: listener, route: route).record(status: status)
    }

    /// The request counter of one route, to keep and call on the hot path: it counts by status
    /// under a lock of its own, with no string work per request.
    public func counter(listener: String, route: String) -> RequestCounter {
        state.withLock { state in
            let key = RouteKey(listener: listener, route: route)
            if let existing = state.counters[key] { return existing }
            let counter = RequestCounter()
            state.counters[key] = counter
            return counter
        }
    }

    /// One proxied request, by the status its client got (or 0 when the connection was cut).
    public func recordProxied(proxy: String, status: Int) {
        state.withLock { $0.proxied[Labels(owner: proxy, value: String(status)), default: 0] += 1 }
    }

    /// A proxied request sent again after its token was refused.
    public func recordProxyRetry(proxy: String) { state.withLock { $0.proxyRetries[proxy, default: 0] += 1 } }

    /// An upstream fetch that a proxied request's refused token started.
    public func recordProxyRefresh(proxy: String) { state.withLock { $0.proxyRefreshes[proxy, default: 0] += 1 } }

    /// Where to read a listener's open connections at scrape time.
    public func observeOpenConnections(listener: String, _ read: @escaping @Sendable () -> Int) {
        state.withLock { $0.openConnections.append((listener, read)) }
    }

    /// Where to read how many idle connections a listener closed to make room for new ones.
    public func observeEvictedConnections(listener: String, _ read: @escaping @Sendable () -> Int) {
        state.withLock { $0.evictedConnections.append((listener, read)) }
    }

    /// Which of a listener's caps refused a request that would have waited.
    public enum WaitLimit: Sendable {
        /// Every place the listener keeps for waiting requests was taken (`too_many_waiting`).
        case listener
        /// The caller's key held its share of them (`too_many_waiting_for_key`).
        case callerKey
    }

    /// Where to read a listener's waiting requests now, and how many of its requests it refused
    /// for want of a waiting place (`limit="listener"`), at scrape time.
    /// - Parameter callerKeys: the listener's routes hold callers to a share per key: its
    ///   `limit="caller_key"` series is shown from the start, at 0.
    public func observeWaiting(
        listener: String, callerKeys: Bool = false, _ read: @escaping @Sendable () -> (waiting: Int, refused: Int)
    ) {
        state.withLock { state in
            state.waiting.append((listener, read))
            if callerKeys { state.keyWaitsRefused[listener, default: 0] += 0 }
        }
    }

    /// A request refused because the cap `limit` names was reached; the listener's own refusals
    /// are read through `observeWaiting` instead, and this counts only the caller key's.
    public func recordWaitRefused(listener: String, limit: WaitLimit) {
        guard case .callerKey = limit else { return }
        state.withLock { $0.keyWaitsRefused[listener, default: 0] += 1 }
    }

    /// Where to read how many answer headers the HTTP library refused (and so were not sent).
    public func observeDroppedResponseHeaders(_ read: @escaping @Sendable () -> Int) {
        state.withLock { $0.droppedResponseHeaders = read }
    }

    /// One finished upstream fetch.
    public func recordFetch(provider: String, error: TokenFetchError?, duration: Duration) {
        let seconds = duration.inSeconds
        state.withLock { state in
            state.refreshes[Labels(owner: provider, value: error?.description ?? "success"), default: 0] += 1
            var histogram = state.latency[provider] ?? Histogram()
            for (index, bound) in Self.latencyBuckets.enumerated() where seconds <= bound {
                histogram.counts[index] += 1
            }
            histogram.total += 1
            histogram.sum += seconds
            state.latency[provider] = histogram
            if let code = error?.httpStatus {
                state.upstreamCodes[Labels(owner: provider, value: String(code)), default: 0] += 1
            }
        }
    }

    /// An upstream answer's status code, for fetches that succeeded over HTTP.
    public func recordUpstreamStatus(provider: String, code: Int) {
        state.withLock { $0.upstreamCodes[Labels(owner: provider, value: String(code)), default: 0] += 1 }
    }

    /// A token answer marked stale, served while refresh was failing.
    public func recordStaleServed(provider: String) { state.withLock { $0.staleServed[provider, default: 0] += 1 } }
    /// A forced refresh that the refresh window refused.
    public func recordExcessiveRefresh(provider: String) { state.withLock { $0.excessive[provider, default: 0] += 1 } }

    /// A template refused a new child: `maxChildren` lived already.
    public func recordChildRefused(template: String) {
        state.withLock { $0.childrenRefused[template, default: 0] += 1 }
    }

    /// A template dropped a child idle for `childIdleSec`.
    public func recordChildDropped(template: String) {
        state.withLock { $0.childrenDropped[template, default: 0] += 1 }
    }

    /// One write of a token file for `provider` (a template's name for a child's file).
    /// One operation of the token store: `load` (served, expired, missing or refused), `save` (ok or
    /// error); with Redis also `lease` (acquired, held), `write` (ok, fenced, error, unreachable),
    /// `message` (received) and `record` (from_fleet: a token another broker fetched, served).
    public func recordStoreOperation(_ operation: String, result: String) {
        state.withLock { $0.storeOperations[Labels(owner: operation, value: result), default: 0] += 1 }
    }

    /// One upstream fetch made through a shared store: `fleet` (holding the lease, stored for
    /// every broker) or `alone` (the store out of reach, or the write fenced out).
    public func recordStoreFetch(for whom: String) { state.withLock { $0.storeFetches[whom, default: 0] += 1 } }

    /// How the metrics learn whether a shared store answers, and since when it has not.
    public func observeStoreHealth(_ read: @escaping @Sendable () -> (reachable: Bool, secondsSinceReachable: Double?))
    {
        state.withLock { $0.storeHealth = read }
    }

    /// How a configuration reload ends: one of `reloadResults`.
    public static let reloadResults = ["reloaded", "invalid", "refused", "abandoned"]

    /// One configuration reload, by how it ended (`reloadResults`).
    public func recordReload(result: String) { state.withLock { $0.reloads[result, default: 0] += 1 } }

    public func recordSinkWrite(provider: String, succeeded: Bool) {
        state.withLock { $0.sinkWrites[Labels(owner: provider, value: succeeded ? "ok" : "error"), default: 0] += 1 }
    }

    // MARK: - Rendering

    /// The exposition text: counters as recorded, gauges from `statuses` (the ordinary
    /// providers') and `templates`. A template's children are never a series of their own: their
    /// gauges are counted under the template's name, so that no requested value is a label.
    public func render(statuses: [ProviderStatus], templates: [TemplateStatus] = []) -> String {
        let snapshot = state.withLock { $0 }
        var out = ""
        func family(_ name: String, _ type: String, _ help: String) {
            out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        }
        func sample(_ name: String, _ labels: [(String, String)], _ value: String) {
            let text = labels.map { "\($0.0)=\"\(Self.escape($0.1))\"" }.joined(separator: ",")
            out += labels.isEmpty ? "\(name) \(value)\n" : "\(name){\(text)} \(value)\n"
        }
        /// A counter family with one label, sorted by it.
        func counters(_ name: String, _ help: String, label: String, _ values: [String: Int]) {
            family(name, "counter", help)
            for (key, count) in values.sorted(by: { $0.key < $1.key }) { sample(name, [(label, key)], String(count)) }
        }
        /// A counter family with two labels, sorted by them.
        func counters(_ name: String, _ help: String, labels: (String, String), _ values: [Labels: Int]) {
            family(name, "counter", help)
            for (key, count) in values.sorted(by: { ($0.key.owner, $0.key.value) < ($1.key.owner, $1.key.value) }) {
                sample(name, [(labels.0, key.owner), (labels.1, key.value)], String(count))
            }
        }

        family("token_broker_build_info", "gauge", "Always 1; the version is a label.")
        sample("token_broker_build_info", [("version", version)], "1")

        family("token_broker_http_requests_total", "counter", "Answered requests by listener, route and status code.")
        for (key, counter) in snapshot.counters.sorted(by: {
            ($0.key.listener, $0.key.route) < ($1.key.listener, $1.key.route)
        }) {
            for (status, count) in counter.counts.sorted(by: { $0.key < $1.key }) {
                sample(
                    "token_broker_http_requests_total",
                    [("listener", key.listener), ("route", key.route), ("code", String(status))], String(count))
            }
        }

        family(
            "token_broker_open_connections", "gauge", "Connections open now, by listener (idle, reading, or waiting).")
        for (listener, read) in snapshot.openConnections {
            sample("token_broker_open_connections", [("listener", listener)], String(read()))
        }
        family(
            "token_broker_connections_evicted_total", "counter",
            "Idle connections closed to make room for new ones when a listener was near its connection limit.")
        for (listener, read) in snapshot.evictedConnections {
            sample("token_broker_connections_evicted_total", [("listener", listener)], String(read()))
        }
        family(
            "token_broker_waiting_requests", "gauge",
            "Requests waiting now, by listener: long-polls, first tokens, on-demand fetches, forced refreshes, proxied exchanges before their answer."
        )
        let waiting = snapshot.waiting.map { ($0.listener, $0.read()) }
        for (listener, read) in waiting {
            sample("token_broker_waiting_requests", [("listener", listener)], String(read.waiting))
        }
        family(
            "token_broker_waits_refused_total", "counter",
            "Requests refused at once instead of waiting: every waiting place of the listener was taken (limit=listener), or the caller key held its half of them (limit=caller_key)."
        )
        for (listener, read) in waiting {
            sample(
                "token_broker_waits_refused_total", [("listener", listener), ("limit", "listener")],
                String(read.refused))
        }
        for (listener, count) in snapshot.keyWaitsRefused.sorted(by: { $0.key < $1.key }) {
            sample(
                "token_broker_waits_refused_total", [("listener", listener), ("limit", "caller_key")], String(count))
        }
        if let read = snapshot.droppedResponseHeaders {
            family(
                "token_broker_response_headers_dropped_total", "counter",
                "Answer headers the HTTP library refused (such as a proxied header with a character it does not allow); they were not sent."
            )
            sample("token_broker_response_headers_dropped_total", [], String(read()))
        }

        counters(
            "token_broker_proxy_requests_total", "Proxied requests by proxy and the status the client got.",
            labels: ("proxy", "code"), snapshot.proxied)
        counters(
            "token_broker_proxy_retries_total", "Proxied requests sent again with a refreshed token after a refusal.",
            label: "proxy", snapshot.proxyRetries)
        counters(
            "token_broker_proxy_refreshes_total",
            "Upstream token fetches started because a proxied request's token was refused.",
            label: "proxy", snapshot.proxyRefreshes)

        counters(
            "token_broker_refreshes_total",
            "Upstream fetches by provider and result (success or the error's classification).",
            labels: ("provider", "result"), snapshot.refreshes)

        family("token_broker_refresh_duration_seconds", "histogram", "How long upstream fetches took.")
        for (provider, histogram) in snapshot.latency.sorted(by: { $0.key < $1.key }) {
            for (index, bound) in Self.latencyBuckets.enumerated() {
                sample(
                    "token_broker_refresh_duration_seconds_bucket",
                    [("provider", provider), ("le", Self.number(bound))], String(histogram.counts[index]))
            }
            sample(
                "token_broker_refresh_duration_seconds_bucket", [("provider", provider), ("le", "+Inf")],
                String(histogram.total))
            sample("token_broker_refresh_duration_seconds_sum", [("provider", provider)], Self.number(histogram.sum))
            sample("token_broker_refresh_duration_seconds_count", [("provider", provider)], String(histogram.total))
        }

        counters(
            "token_broker_upstream_responses_total", "Upstream HTTP status codes by provider.",
            labels: ("provider", "code"), snapshot.upstreamCodes)
        counters(
            "token_broker_stale_tokens_served_total", "Token answers marked stale, served while refresh was failing.",
            label: "provider", snapshot.staleServed)
        counters(
            "token_broker_excessive_refreshes_total", "Forced refreshes refused by the refresh window.",
            label: "provider", snapshot.excessive)

        family(
            "token_broker_token_expiry_seconds", "gauge",
            "Seconds until the cached token expires (absent without a valid token with expiry).")
        for status in statuses {
            if let left = status.expiresIn {
                sample("token_broker_token_expiry_seconds", [("provider", status.name)], Self.number(left.inSeconds))
            }
        }

        family("token_broker_token_version", "gauge", "The version of the valid cached token, 0 when there is none.")
        for status in statuses {
            sample("token_broker_token_version", [("provider", status.name)], String(status.version ?? 0))
        }

        family(
            "token_broker_longpoll_waiters", "gauge",
            "Requests waiting for a token (long-polls, on-demand fetches, forced refreshes).")
        for status in statuses {
            sample("token_broker_longpoll_waiters", [("provider", status.name)], String(status.waiters))
        }
        for template in templates {
            sample("token_broker_longpoll_waiters", [("provider", template.name)], String(template.waiters))
        }

        family("token_broker_provider_state", "gauge", "1 for the provider's current state.")
        for status in statuses {
            for phase in ProviderPhase.allCases {
                sample(
                    "token_broker_provider_state", [("provider", status.name), ("state", phase.rawValue)],
                    status.phase == phase ? "1" : "0")
            }
        }

        family("token_broker_template_children", "gauge", "Children a provider template keeps now.")
        for template in templates {
            sample("token_broker_template_children", [("provider", template.name)], String(template.children))
        }
        family("token_broker_template_children_ready", "gauge", "A template's children that can answer now.")
        for template in templates {
            sample("token_broker_template_children_ready", [("provider", template.name)], String(template.ready))
        }
        counters(
            "token_broker_template_children_refused_total",
            "New children a template refused because maxChildren lived already.", label: "provider",
            snapshot.childrenRefused)
        counters(
            "token_broker_template_children_dropped_total", "Children a template dropped, unread for childIdleSec.",
            label: "provider", snapshot.childrenDropped)
        counters(
            "token_broker_sink_writes_total", "Token file writes by provider and result (ok or error).",
            labels: ("provider", "result"), snapshot.sinkWrites)
        counters(
            "token_broker_store_operations_total",
            "Token store operations by kind and result: load (served, expired, missing, refused), save (ok, "
                + "error); with Redis also lease (acquired, held), write (ok, fenced, error, unreachable), message "
                + "(received) and record (from_fleet).",
            labels: ("operation", "result"), snapshot.storeOperations)
        counters(
            "token_broker_reloads_total",
            "Configuration reloads by result: reloaded, invalid (the file), refused (a change that needs a "
                + "restart), abandoned (a new provider or a token file got no token in time, or the broker "
                + "began to stop).",
            label: "result", snapshot.reloads)
        if let read = snapshot.storeHealth {
            counters(
                "token_broker_store_fetches_total",
                "Upstream fetches made through the shared store: for the fleet (holding the lease) or alone.",
                label: "for", snapshot.storeFetches)
            let health = read()
            family("token_broker_store_reachable", "gauge", "1 while the shared store (Redis) answers, else 0.")
            sample("token_broker_store_reachable", [], health.reachable ? "1" : "0")
            family(
                "token_broker_store_seconds_since_reachable", "gauge",
                "Seconds since the shared store last answered (0 while it answers; -1 if it never has).")
            let seconds = health.reachable ? 0 : (health.secondsSinceReachable ?? -1)
            sample("token_broker_store_seconds_since_reachable", [], String(seconds))
        }
        return out
    }

    private static func escape(_ value: String) -> String {
        var out = ""
        for character in value {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(character)
            }
        }
        return out
    }

    private static func number(_ value: Double) -> String {
        abs(value) < 1e15 ? Int64(exactly: value).map { String($0) } ?? String(value) : String(value)
    }
}

/// Answered requests of one route, by status code.
///
/// 200, by far the most common, is an atomic counter; other codes share a locked dictionary.
public final class RequestCounter: Sendable {
    private let ok = Atomic<Int>(0)
    private let others = Lock<[Int: Int]>([:])

    /// One answer with `status`.
    public func record(status: Int) {
        if status == 200 {
            ok.add(1, ordering: .relaxed)
        } else {
            others.withLock { $0[status, default: 0] += 1 }
        }
    }

    var counts: [Int: Int] {
        var counts = others.withLock { $0 }
        let okCount = ok.load(ordering: .relaxed)
        if okCount > 0 { counts[200] = okCount }
        return counts
    }
}
