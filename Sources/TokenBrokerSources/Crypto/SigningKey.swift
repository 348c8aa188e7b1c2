internal import COpenSSL
import TokenBrokerCore
import TokenBrokerCrypto

/// A key that signs JWS: an EC P-256 or RSA private key in OpenSSL, or an HMAC secret.
///
/// Owns its `EVP_PKEY` and frees it in `deinit`. Signing only reads the key, so one key may
/// sign from several threads at once.
public final class SigningKey: @unchecked Sendable {
    /// The JWS algorithm: `ES256`, `RS256` or `HS256`.
    public let algorithm: JWSAlgorithm
    private let pkey: OpaquePointer?
    private let secret: [UInt8]

    /// The public key as JWK members, read once when the key is loaded; nil for HS256.
    private let publicMembers: [(String, String)]?
    /// The key's id when none is configured, computed once when the key is loaded.
    private let computedThumbprint: String

    /// Takes ownership of `pkey`; frees it when reading its public half fails.
    private init(algorithm: JWSAlgorithm, pkey: OpaquePointer?, secret: [UInt8] = []) throws(TokenFetchError) {
        self.algorithm = algorithm
        self.pkey = pkey
        self.secret = secret
        do throws(TokenFetchError) {
            var members: [(String, String)]?
            if let pkey { members = try Self.publicMembers(of: pkey, algorithm: algorithm) }
            publicMembers = members
            computedThumbprint = try Self.thumbprint(members: members, secret: secret)
        } catch {
            if let pkey { EVP_PKEY_free(pkey) }
            throw error
        }
    }

    deinit { if let pkey { EVP_PKEY_free(pkey) } }

    /// A new key generated at start: P-256 for ES256, 2048-bit RSA for RS256.
    public static func generate(algorithm: JWSAlgorithm) throws(TokenFetchError) -> SigningKey {
        let pkey: OpaquePointer?
        switch algorithm {
        case .es256: pkey = COpenSSL_generate_ec_key("P-256")
        case .rs256: pkey = COpenSSL_generate_rsa_key(2048)
        case .hs256: throw .configuration("cannot generate a key for \(algorithm); give a keyFile")
        }
        guard let pkey else { throw .internalError("key generation failed: \(Crypto.lastError())") }
        return try SigningKey(algorithm: algorithm, pkey: pkey)
    }

    /// A key read from `contents`: a PEM private key, or for HS256 the secret bytes themselves
    /// (one trailing newline is dropped, since `echo` adds one).
    public static func load(algorithm: JWSAlgorithm, contents: [UInt8], path: String) throws(TokenFetchError)
        -> SigningKey
    {
        if algorithm == .hs256 {
            var secret = contents
            if secret.last == UInt8(ascii: "\n") { secret.removeLast() }
            guard secret.count >= 32 else {
                throw .configuration("\(path): an HS256 secret needs at least 32 bytes, found \(secret.count)")
            }
            return try SigningKey(algorithm: algorithm, pkey: nil, secret: secret)
        }
        let pkey = try readPrivateKey(contents, path: path)
        guard Self.fits(pkey, algorithm: algorithm) else {
            let kind = Self.kind(of: pkey)
            EVP_PKEY_free(pkey)
            throw .configuration(
                "\(path): the key does not fit \(algorithm): it is \(kind); \(Self.wanted(by: algorithm))")
        }
        return try SigningKey(algorithm: algorithm, pkey: pkey)
    }

    /// A `private_key_jwt` client's key from `contents`: an EC key signs with ES256, an RSA key
    /// with RS256, each only if it is what its algorithm needs; the error says what the key is.
    public static func loadAssertionKey(contents: [UInt8], path: String) throws(TokenFetchError) -> SigningKey {
        let pkey = try readPrivateKey(contents, path: path)
        let algorithm: JWSAlgorithm
        switch EVP_PKEY_get_base_id(pkey) {
        case EVP_PKEY_EC: algorithm = .es256
        case EVP_PKEY_RSA: algorithm = .rs256
        default:
            let kind = Self.kind(of: pkey)
            EVP_PKEY_free(pkey)
            throw .configuration(
                "\(path): the key does not fit private_key_jwt: it is \(kind); it signs with ES256, which wants"
                    + " EC on the P-256 curve (also called prime256v1 or secp256r1), or RS256, which wants RSA of"
                    + " 2048 bits or more")
        }
        EVP_PKEY_free(pkey)
        return try load(algorithm: algorithm, contents: contents, path: path)
    }

    /// What the algorithm takes, for the error that refuses another key.
    private static func wanted(by algorithm: JWSAlgorithm) -> String {
        switch algorithm {
        case .es256: "ES256 wants EC on the P-256 curve, also called prime256v1 or secp256r1"
        case .rs256: "RS256 wants RSA of 2048 bits or more"
        case .hs256: "HS256 wants a file of secret bytes"
        }
    }

    /// What a key is, for an error: "EC on the secp256k1 curve", "RSA of 1024 bits", "an ED25519 key".
    private static func kind(of pkey: OpaquePointer) -> String {
        switch EVP_PKEY_get_base_id(pkey) {
        case EVP_PKEY_EC:
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_group_name(pkey, &name, name.count, &length) == 1 else {
                ERR_clear_error()
                return "EC on a curve given by its parameters, not by name"
            }
            return "EC on the \(Self.text(name)) curve"
        case EVP_PKEY_RSA:
            return "RSA of \(EVP_PKEY_get_bits(pkey)) bits"
        case EVP_PKEY_RSA_PSS:
            return "RSA-PSS (an RSA key restricted to PSS signatures) of \(EVP_PKEY_get_bits(pkey)) bits"
        default:
            guard let name = EVP_PKEY_get0_type_name(pkey) else { return "a key of another kind" }
            return "an \(String(cString: name)) key"
        }
    }

    private static func text(_ name: [CChar]) -> String {
        String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// A PEM private key of any kind from `contents`, which the caller frees; a key protected by
    /// a pass phrase is refused, never asked for.
    static func readPrivateKey(_ contents: [UInt8], path: String) throws(TokenFetchError) -> OpaquePointer {
        guard let length = Int32(exactly: contents.count) else {
            throw .configuration("\(path): not a PEM private key")
        }
        // Never prompt: without a callback OpenSSL asks the controlling terminal for a pass
        // phrase, and would wait there for ever. This one refuses and notes that it was asked.
        var askedForPassphrase = false
        let pkey: OpaquePointer? = contents.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, length) else { return nil }
            defer { BIO_free(bio) }
            return withUnsafeMutablePointer(to: &askedForPassphrase) { asked in
                PEM_read_bio_PrivateKey(bio, nil, refusePassphrase, asked)
            }
        }
        guard let pkey else {
            ERR_clear_error()
            if askedForPassphrase {
                throw .configuration(
                    "\(path): the key is protected by a pass phrase; give it unencrypted (openssl pkey -in KEY -out PLAIN), readable only by the broker"
                )
            }
            throw .configuration("\(path): not a PEM private key")
        }
        return pkey
    }

    /// Whether the key is what the algorithm needs: the P-256 curve itself for ES256 (other
    /// 256-bit curves, such as secp256k1 or brainpoolP256r1, make signatures no ES256 verifier
    /// accepts), RSA of 2048 bits or more for RS256.
    private static func fits(_ pkey: OpaquePointer, algorithm: JWSAlgorithm) -> Bool {
        switch algorithm {
        case .es256:
            guard EVP_PKEY_get_base_id(pkey) == EVP_PKEY_EC else { return false }
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_group_name(pkey, &name, name.count, &length) == 1 else {
                ERR_clear_error()
                return false
            }
            let group = Self.text(name)
            return group == "prime256v1" || group == "P-256"
        case .rs256:
            return EVP_PKEY_get_base_id(pkey) == EVP_PKEY_RSA && EVP_PKEY_get_bits(pkey) >= 2048
        case .hs256:
            return false
        }
    }

    /// Signs `message` and returns the JWS signature bytes (for ES256, raw r‖s, not DER).
    public func sign(_ message: [UInt8]) throws(TokenFetchError) -> [UInt8] {
        guard let pkey else { return try Crypto.hmacSHA256(key: secret, message: message) }
        guard let context = EVP_MD_CTX_new() else { throw .internalError("out of memory") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pkey) == 1 else {
            throw .internalError("signing failed: \(Crypto.lastError())")
        }
        var length = 0
        guard EVP_DigestSign(context, nil, &length, message, message.count) == 1 else {
            throw .internalError("signing failed: \(Crypto.lastError())")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, message, message.count) == 1 else {
            throw .internalError("signing failed: \(Crypto.lastError())")
        }
        signature.removeLast(signature.count - length)
        return algorithm == .es256 ? try Self.rawECDSA(fromDER: signature) : signature
    }

    /// The public key as JWK members in RFC 7638 order (no `kid`, `use` or `alg`); nil for HS256,
    /// whose secret must never be published.
    public func publicJWKMembers() -> [(String, String)]? { publicMembers }

    /// The key's id when none is configured, base64url: for ES256 and RS256 the RFC 7638
    /// thumbprint; for HS256 the first 16 bytes of SHA-256(SHA-256(secret)), which names the
    /// secret without being a plain hash of it.
    public func thumbprint() -> String { computedThumbprint }

    private static func thumbprint(members: [(String, String)]?, secret: [UInt8]) throws(TokenFetchError) -> String {
        guard let members else {
            return Base64URL.encode(try Crypto.sha256(try Crypto.sha256(secret)).prefix(16))
        }
        let canonical = JSONText.object(members.map { ($0.0, JSONText.quoted($0.1)) })
        return Base64URL.encode(try Crypto.sha256(Array(canonical.utf8)))
    }

    /// Reads the public half of an EC or RSA key as JWK members.
    /// - Throws: `internalError` when OpenSSL cannot give a parameter (a key published without
    ///   them would be a JWKS that verifies nothing).
    private static func publicMembers(of pkey: OpaquePointer, algorithm: JWSAlgorithm) throws(TokenFetchError) -> [(
        String, String
    )] {
        if algorithm == .es256 {
            let x = try bignum(pkey, "qx", width: 32)
            let y = try bignum(pkey, "qy", width: 32)
            return [("crv", "P-256"), ("kty", "EC"), ("x", Base64URL.encode(x)), ("y", Base64URL.encode(y))]
        }
        let n = try bignum(pkey, "n", width: 0)
        let e = try bignum(pkey, "e", width: 0)
        return [("e", Base64URL.encode(e)), ("kty", "RSA"), ("n", Base64URL.encode(n))]
    }

    private static func bignum(_ pkey: OpaquePointer, _ name: String, width: Int) throws(TokenFetchError) -> [UInt8] {
        var number: OpaquePointer? = nil
        guard EVP_PKEY_get_bn_param(pkey, name, &number) == 1, let number else {
            throw .internalError("cannot read the key's \(name): \(Crypto.lastError())")
        }
        defer { BN_free(number) }
        let length = width > 0 ? width : Int((BN_num_bits(number) + 7) / 8)
        var bytes = [UInt8](repeating: 0, count: length)
        guard let padded = Int32(exactly: length), BN_bn2binpad(number, &bytes, padded) == padded else {
            throw .internalError("the key's \(name) does not fit \(length) bytes")
        }
        return bytes
    }

    /// Converts OpenSSL's DER `ECDSA-Sig-Value` into JWS's fixed-width r‖s (RFC 7518 §3.4).
    private static func rawECDSA(fromDER der: [UInt8]) throws(TokenFetchError) -> [UInt8] {
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw .internalError("could not parse the ECDSA signature") }
        defer { ECDSA_SIG_free(parsed) }
        var r: OpaquePointer? = nil
        var s: OpaquePointer? = nil
        ECDSA_SIG_get0(parsed, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        guard BN_bn2binpad(r, &raw, 32) == 32,
            raw.withUnsafeMutableBufferPointer({ BN_bn2binpad(s, $0.baseAddress! + 32, 32) }) == 32
        else { throw .internalError("ECDSA signature out of range") }
        return raw
    }
}

/// The pass-phrase callback for reading keys: refuses (OpenSSL then fails the read) and records
/// that a pass phrase was wanted, through the `Bool` its context points to.
private let refusePassphrase:
    @convention(c) (UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?) -> Int32 = {
        _, _, _, context in
        context?.assumingMemoryBound(to: Bool.self).pointee = true
        return -1
    }
