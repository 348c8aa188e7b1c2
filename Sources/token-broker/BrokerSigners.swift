import TokenBrokerCore
import TokenBrokerSources

/// What start, `--check-config` and each reload refuse in the local signers' settings beyond
/// what reading one signer's key shows: keys the JWKS could not publish apart, and claims too
/// long for any token.
extension Broker {
    /// A signer a reload changed or removed, whose key the JWKS keeps publishing until the last
    /// token it signed expires.
    struct RetiredSigner {
        let signer: JWTSigner
        /// The provider that signed with it.
        let provider: String
        let until: ContinuousClock.Instant
    }

    /// Why the JWKS cannot publish the configuration's keys: two different public keys under one
    /// `kid`, from two providers, or from a provider and a key `retired` by a reload whose
    /// tokens may still be valid (a rotation that keeps its configured `kid`). A verifier finds
    /// a token's key by its `kid`, and takes the first key it finds under it (PyJWT's
    /// `PyJWKClient`, for one): the tokens of the other would never verify. The same key under
    /// one `kid` twice is published once, and an HS256 secret is never published.
    static func keyIDClash(
        _ configuration: BrokerConfiguration, _ sources: [(any TokenSource, JWTSigner?)],
        retired: [RetiredSigner] = [], now: ContinuousClock.Instant = .now
    ) -> ConfigurationError? {
        let signers = zip(configuration.providers.indices, sources).compactMap { index, source in
            source.1.map { (index: index, signer: $0) }
        }
        for (position, (index, signer)) in signers.enumerated() {
            let key = "providers[\(index)].source.kid"
            let name = JSONText.quoted(configuration.providers[index].name)
            let kid = JSONText.quoted(signer.keyID)
            if let earlier = signers[..<position].first(where: {
                signer.publishesAnotherKey(underTheKeyIDOf: $0.signer)
            }) {
                return ConfigurationError(
                    key: key,
                    "provider \(name) signs with another key than provider"
                        + " \(JSONText.quoted(configuration.providers[earlier.index].name)) under the same kid \(kid):"
                        + " a verifier finds the key by its kid and could not tell which of the two verifies a token;"
                        + " give each key a kid of its own (left out, the kid is the key's thumbprint)")
            }
            if let old = retired.first(where: {
                $0.until > now && signer.publishesAnotherKey(underTheKeyIDOf: $0.signer)
            }) {
                let whose =
                    old.provider == configuration.providers[index].name
                    ? "it" : "provider \(JSONText.quoted(old.provider))"
                let left = (old.until - now).components
                let seconds = left.seconds + (left.attoseconds > 0 ? 1 : 0)
                var problem =
                    "provider \(name) would sign with another key under kid \(kid), which names the key \(whose)"
                    + " signed with before a reload, published for \(seconds) s more so that its tokens still verify:"
                    + " a verifier finds the key by its kid and could not tell the two apart; give the new key"
                    + " another kid (left out, the kid is the key's thumbprint)"
                if signer.configuration.keyFile == nil {
                    problem += " or a keyFile (without one, each change to the provider makes it a new key)"
                }
                return ConfigurationError(key: key, problem)
            }
        }
        return nil
    }

    /// Why `signer` can mint no token the broker serves: its configured claims and `kid` make each
    /// token longer than `TokenRules.maximumTokenBytes`, whatever a template's child asks for
    /// (`perRequest`: its scope is added, its audience replaces the configured one). Names the
    /// longest of them, under `key` (such as `providers[0].source`).
    static func tokenSizeProblem(
        _ signer: JWTSigner, perRequest: Set<RequestParameter>, key: String
    ) throws(TokenFetchError) -> ConfigurationError? {
        let audienceAsked = perRequest.contains(.audience)
        let length = try signer.shortestTokenBytes(audienceAsked: audienceAsked)
        guard length > TokenRules.maximumTokenBytes else { return nil }
        let settings = signer.configuration
        var values = [("issuer", settings.issuer), ("subject", settings.subject)]
        if !audienceAsked { values.append(("audience", settings.audience)) }
        if let kid = settings.keyID { values.append(("kid", kid)) }
        let longest = values.max { $0.1.utf8.count < $1.1.utf8.count }?.0 ?? "kid"
        return ConfigurationError(
            key: "\(key).\(longest)",
            "makes each token \(perRequest.isEmpty ? "" : "at least ")\(length) bytes long, more than the"
                + " \(TokenRules.maximumTokenBytes) a token may have: every token carries the issuer, subject,"
                + " audience and kid, base64url-encoded (4 bytes for 3)")
    }
}
