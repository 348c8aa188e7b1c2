import TokenBrokerCore

/// A source that can stand behind a provider template (`perRequest`): for each child's values,
/// it makes a source of its own that fetches with those values put in.
///
/// The `oauth2` and `http` sources and the local signer are templated sources; the file source
/// is not (the configuration refuses a template over a file). A child shares with its template
/// what is expensive or must be one: the signing key, the client-assertion key, the HTTP client
/// and the parsed configuration; it holds only its values besides.
public protocol TemplatedTokenSource: TokenSource {
    /// The values this source fetches with: `.none` for a configured provider's own source.
    var values: TokenRequestValues { get }

    /// A source that fetches with `values` instead of this one's. The configured defaults stay
    /// those of the configuration, so `child(for: .none)` fetches exactly as the configured
    /// source does. An `http` source's placeholders have no default: its child refuses to fetch
    /// without each value they use (`ProviderConfiguration.requiredParameters`).
    func child(for values: TokenRequestValues) -> Self
}
