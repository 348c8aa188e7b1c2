import TokenBrokerCore

/// The child values last checked for one query value of one compatibility route, so that a
/// client asking the same thing again (an SDK asks the same scope or resource every time) skips
/// the allow-list checks and the building of the values. Only an accepted value is kept; the
/// checks depend only on the value and the configuration, which does not change.
final class CheckedValuesMemo: Sendable {
    private let last = Lock<(key: String, values: TokenRequestValues)?>(nil)

    /// The values for `key`: the ones kept when it is the key last checked, else `check`'s, kept.
    func values(for key: String, check: () throws(BadRequest) -> TokenRequestValues) throws(BadRequest)
        -> TokenRequestValues
    {
        if let kept = last.withLock({ $0?.key == key ? $0?.values : nil }) { return kept }
        let values = try check()
        last.withLock { $0 = (key, values) }
        return values
    }
}
