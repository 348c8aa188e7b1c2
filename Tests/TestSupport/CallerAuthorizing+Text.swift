// Caller checks asked with a header written as text, for tests. The broker passes the header's
// bytes as sent (`CallerAuthorizing`): a string made of them would turn bytes that are not UTF-8
// into U+FFFD, which is why this form is not the broker's.
import TokenBrokerCore

extension CallerAuthorizing {
    /// `authorize(_:provider:)` for a header given as text: its UTF-8.
    public func authorize(_ authorization: String?, provider: String) -> CallerDecision {
        guard var authorization else { return authorize(UnsafeBufferPointer<UInt8>?.none, provider: provider) }
        return authorization.withUTF8 { authorize($0, provider: provider) }
    }
}
