extension OAuth2SourceConfiguration {
    /// How the client authenticates to the token endpoint (`clientAuth`).
    ///
    /// The raw value is the name as configured, from the OAuth 2.0 client metadata registry.
    public enum ClientAuth: String, Sendable, CaseIterable, CustomStringConvertible {
        /// The client id and secret in `Authorization: Basic` (RFC 6749 §2.3.1). The default.
        case clientSecretBasic = "client_secret_basic"
        /// The client id and secret as form parameters (RFC 6749 §2.3.1).
        case clientSecretPost = "client_secret_post"
        /// A JWT signed with the client's private key (RFC 7523 §2.2).
        case privateKeyJWT = "private_key_jwt"

        /// The name, such as `client_secret_basic`.
        public var description: String { rawValue }
    }
}
