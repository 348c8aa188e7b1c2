import Glibc
import TokenBrokerCore

/// For one route and its template, the child values last checked for one key, and the lease of
/// their child: a client asking the same thing again (an SDK asks the same scope or resource
/// every time, a service the same audience) skips the allow-list checks, the building of the
/// values, and the template's look-up of the child (`TemplateProviding.renew(_:)` reads it
/// again, unless it was dropped). The key is what the request named: a compatibility route's
/// query value, or a template route's `audience`, `scope` and `resource`. Only an accepted key
/// is kept; the checks depend only on the key and the route's configuration, which does not
/// change (a reload makes new routes).
///
/// The memo keeps the lease, which lets go of its child when it ends: a dropped child, with the
/// token in its rendered answers, is freed when the template lets go of it, not kept until this
/// route's next request. (Holding the lease weakly would do the same, at some 600 instructions a
/// request: every reference count of an object with weak references takes the slow path.)
final class CheckedValuesMemo<Key: ExactKey, Provider: TokenProviding>: Sendable {
    /// The template the children come from.
    let template: any TemplateProviding<Provider>
    private let last = Lock<Kept?>(nil)

    private struct Kept: Sendable {
        let key: Key
        let values: TokenRequestValues
        /// The lease of the child last found for `values`; nil when the template refused one.
        let lease: TemplateLease<Provider>?
    }

    init(_ template: any TemplateProviding<Provider>) { self.template = template }

    /// The template's child for `key`: the one kept, read again, when `key` is the key last
    /// checked and the child was not dropped; else the template's child for the values kept for
    /// `key` or, for another key, for `check`'s, kept with them.
    func child(for key: Key, check: () throws(BadRequest) -> TokenRequestValues) throws(BadRequest) -> Result<
        LeasedChild<Provider>, ChildRefusal
    > {
        // Only the lease is copied out on the way that most requests take.
        if let lease = last.withLock({ $0?.key.isExactly(key) == true ? $0?.lease : nil }),
            let child = template.renew(lease)
        {
            return .success(child)
        }
        let values: TokenRequestValues
        if let kept = last.withLock({ $0?.key.isExactly(key) == true ? $0?.values : nil }) {
            values = kept
        } else {
            values = try check()
        }
        let found = template.child(for: values)
        let lease: TemplateLease<Provider>? =
            switch found {
            case .success(let found): found.lease
            case .failure: nil
            }
        last.withLock { $0 = Kept(key: key, values: values, lease: lease) }
        return found.map(\.held)
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
