import Glibc
import TokenBrokerCore

/// The child values last checked for one key of one route, so that a client asking the same
/// thing again (an SDK asks the same scope or resource every time, a service the same audience)
/// skips the allow-list checks and the building of the values. The key is what the request
/// named: a compatibility route's query value, or a template route's `audience`, `scope` and
/// `resource`. Only an accepted key is kept; the checks depend only on the key and the route's
/// configuration, which does not change (a reload makes new routes).
final class CheckedValuesMemo<Key: ExactKey>: Sendable {
    private let last = Lock<(key: Key, values: TokenRequestValues)?>(nil)

    /// The values for `key`: the ones kept when it is the key last checked, else `check`'s, kept.
    func values(for key: Key, check: () throws(BadRequest) -> TokenRequestValues) throws(BadRequest)
        -> TokenRequestValues
    {
        if let kept = last.withLock({ $0?.key.isExactly(key) == true ? $0?.values : nil }) { return kept }
        let values = try check()
        last.withLock { $0 = (key, values) }
        return values
    }
}

/// A memo key compared byte for byte. `String`'s `==` holds canonically equivalent text equal
/// (`K` and KELVIN SIGN, `;` and GREEK QUESTION MARK), where the checks read bytes and refuse
/// anything beyond ASCII: a key equal by `==` alone would skip the check that refuses it.
protocol ExactKey: Sendable {
    func isExactly(_ other: Self) -> Bool
}

extension String: ExactKey {
    /// Byte for byte, in place: lengths first, then one `memcmp` of the two strings' UTF-8. A
    /// memo compares its key on every request, and an SDK's key (a scope URL) is long: walking
    /// two `UTF8View`s costs some 70 instructions a byte.
    func isExactly(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        return withUTF8Bytes { mine in
            other.withUTF8Bytes { theirs in
                // Equal counts: an empty buffer (which may have no address) equals the other.
                guard let mine = mine.baseAddress, let theirs = theirs.baseAddress else { return true }
                return memcmp(mine, theirs, other.utf8.count) == 0
            }
        }
    }
}

extension Optional: ExactKey where Wrapped == String {
    func isExactly(_ other: String?) -> Bool {
        switch (self, other) {
        case (nil, nil): true
        case (let mine?, let theirs?): mine.isExactly(theirs)
        default: false
        }
    }
}
