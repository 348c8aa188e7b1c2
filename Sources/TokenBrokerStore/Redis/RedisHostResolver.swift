import Dispatch
import Glibc
import TokenBrokerCore

/// Looks up the name of the Redis host within the deadline of the call that connects.
///
/// hiredis looks a host name up itself (`getaddrinfo`) at each connection, and nothing bounds
/// that: a DNS server that does not answer held the store's first call, and each reconnection,
/// for as long as resolv.conf's timeouts and attempts add up to (10 s with `timeout:5
/// attempts:2`), far past `timeoutMsec`, and a broker's stop waited for it too. So the store
/// looks the name up itself, on a thread of the lookup's own, waits for it until the call's
/// deadline only, and has hiredis connect to the numeric address.
///
/// A lookup that outlasts its caller cannot be stopped: it goes on, and the next connection
/// attempts (at most one a second while Redis is out of reach) wait for that one rather than
/// start another, so a slow DNS server holds one thread at most. Its answer, once come, serves
/// the attempts of the next `reuse`, so that a name that takes longer than `timeoutMsec` to look
/// up still leads to a connection. An answer none of whose addresses connects is dropped
/// (`forget`): the next attempt looks the name up again.
final class RedisHostResolver: Sendable {
    /// How long an answer serves connection attempts after it came.
    static let reuse: Duration = .seconds(10)

    let host: String
    /// The lookup itself: `getaddrinfo` (`systemLookUp`), or a test's.
    private let lookUp: @Sendable (String) -> Result<[String], RedisFailure>

    /// One call of `getaddrinfo`, under way or done.
    private final class Lookup: Sendable {
        /// Signalled when the answer is in; each waiter that takes the signal gives it back.
        let done = DispatchSemaphore(value: 0)
        /// The addresses, or why there are none, and when the answer came.
        let answer = Lock<(Result<[String], RedisFailure>, ContinuousClock.Instant)?>(nil)
    }

    /// The last lookup started.
    private let latest = Lock<Lookup?>(nil)

    init(host: String, lookUp: @escaping @Sendable (String) -> Result<[String], RedisFailure> = systemLookUp) {
        self.host = host
        self.lookUp = lookUp
    }

    /// Whether `host` is an address already (IPv4 or IPv6), which needs no lookup.
    static func isNumeric(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// The host's addresses, IPv4 first (as hiredis's own lookup preferred them), by `deadline`;
    /// throws a timed-out failure when the lookup has not answered by then.
    /// - Parameter timeoutMsec: the call's, for the failure's description.
    func addresses(by deadline: ContinuousClock.Instant, timeoutMsec: Int) throws(RedisFailure) -> [String] {
        if Self.isNumeric(host) { return [host] }
        let lookup = latest.withLock { latest -> Lookup in
            if let latest {
                guard let (_, answered) = latest.answer.withLock({ $0 }) else { return latest }
                if answered.duration(to: .now) < Self.reuse { return latest }
            }
            let started = Lookup()
            latest = started
            let (host, lookUp) = (host, lookUp)
            DispatchQueue.global().async {
                let answer = lookUp(host)
                started.answer.withLock { $0 = (answer, .now) }
                started.done.signal()
            }
            return started
        }
        let left = ContinuousClock.now.duration(to: deadline).wholeMilliseconds
        guard left > 0, lookup.done.wait(timeout: .now() + .milliseconds(Int(clamping: left))) == .success else {
            throw RedisFailure("looking up \(host) took longer than \(timeoutMsec) ms", timedOut: true)
        }
        lookup.done.signal()
        guard let (answer, _) = lookup.answer.withLock({ $0 }) else {
            throw RedisFailure("looking up \(host) gave no answer")
        }
        return try answer.get()
    }

    /// Drops the last answer, when none of its addresses connected: the next attempt looks again.
    func forget() {
        latest.withLock { latest in
            if latest?.answer.withLock({ $0 }) != nil { latest = nil }
        }
    }

    /// `getaddrinfo` for a stream socket, each address in numeric form, once, IPv4 first.
    static func systemLookUp(_ host: String) -> Result<[String], RedisFailure> {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &list)
        guard status == 0 else {
            let reason = status == EAI_SYSTEM ? String(cString: strerror(errno)) : String(cString: gai_strerror(status))
            return .failure(RedisFailure("cannot look up \(host): \(reason)"))
        }
        defer { freeaddrinfo(list) }
        var v4: [String] = []
        var v6: [String] = []
        var node = list
        while let entry = node {
            node = entry.pointee.ai_next
            var text = [CChar](repeating: 0, count: 1025)  // NI_MAXHOST
            guard
                getnameinfo(
                    entry.pointee.ai_addr, entry.pointee.ai_addrlen, &text, socklen_t(text.count), nil, 0,
                    NI_NUMERICHOST) == 0
            else { continue }
            let address = text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            if entry.pointee.ai_family == AF_INET {
                if !v4.contains(address) { v4.append(address) }
            } else if !v6.contains(address) {
                v6.append(address)
            }
        }
        guard !(v4.isEmpty && v6.isEmpty) else { return .failure(RedisFailure("\(host) has no address")) }
        return .success(v4 + v6)
    }
}
