// How much request body each listener's routes read before they answer 413.

/// The most body, in bytes, a listener reads into memory for a request (`HTTPServer`'s
/// `maximumBodyBytes`); a longer one is refused with 413 `payload_too_large`. A body arrives
/// before the caller key and the request guard can be checked, so each cap is what its routes
/// need and no more: an unchecked client holds at most this much per connection.
///
/// Proxied requests (`/proxy/…`) are not read this way: they stream, under the proxy's own `maxBodyBytes`.
public enum BodyLimits {
    /// The token listener and a cloud SDK protocol's own listener: the only body they take is
    /// `POST /token/refresh`'s, a JSON object with one number.
    public static let tokenRoutes = 4 * 1024
    /// The admin listener: `POST /reload` takes no body; a small one (an empty JSON object, a
    /// form field) is read and ignored rather than refused.
    public static let admin = 1024
}
