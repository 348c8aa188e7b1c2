import TokenBrokerCore

/// The token listener's places for waiting requests that each caller key holds (`clientKeysFile`),
/// so that one key cannot take the places of the others.
///
/// The listener lets seven eighths of its connections wait (`HTTPServer.Configuration.waitingLimit`);
/// one key may hold at most half of those (`limit`). A request whose key holds that many already
/// is refused at once (429 `too_many_waiting_for_key`), before it waits. Two keys together can
/// still take every place; without keys, callers on one machine cannot be told apart, and the
/// listener's own cap is the protection.
///
/// A key is told by the hash its entry lists (`AdmittedCaller.keyDigest`), as the caller check
/// finds it: nothing is hashed here, and no key is kept. The table holds only keys with a
/// request waiting. The lock is taken only by requests that wait, twice each; requests answered
/// at once never reach it.
public final class KeyWaitingPlaces: Sendable {
    /// The most requests one key may have waiting at once.
    public let limit: Int
    private let held = Lock<[[UInt8]: Int]>([:])

    /// - Parameter listenerPlaces: the listener's places for waiting requests; each key may hold half.
    public init(listenerPlaces: Int) {
        limit = max(1, listenerPlaces / 2)
    }

    /// Takes a place for `key`; false when it holds `limit` already.
    func take(_ key: [UInt8]) -> Bool {
        held.withLock { held in
            let holding = held[key, default: 0]
            guard holding < limit else { return false }
            held[key] = holding + 1
            return true
        }
    }

    /// Gives back a place `take` gave `key`; once per place taken.
    func giveBack(_ key: [UInt8]) {
        held.withLock { held in
            guard let holding = held[key] else { return }
            held[key] = holding > 1 ? holding - 1 : nil
        }
    }

    /// The places `key` holds now.
    func holding(_ key: [UInt8]) -> Int { held.withLock { $0[key, default: 0] } }

    /// Keys with a request waiting now.
    var keysWaiting: Int { held.withLock { $0.count } }
}
