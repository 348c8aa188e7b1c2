internal import COpenSSL
import TokenBrokerCore

/// A key that signs JWS: an EC P-256 or RSA private key in OpenSSL, or an HMAC secret.
///
/// Owns its `EVP_PKEY` and frees it in `deinit`. Signing only reads the key, so one key may
/// sign from several threads at once.
public final class SigningKey: @unchecked Sendable {
    /// The JWS algorithm: `ES256`, `RS256` or `HS256`.
    public let algorithm: String
    private let pkey: OpaquePointer?
    private let secret: [UInt8]

    private init(algorithm: String, pkey: OpaquePointer?, secret: [UInt8] = []) {
        self.algorithm = algorithm
        self.pkey = pkey
        self.secret = secret
    }

    deinit { if let pkey { EVP_PKEY_free(pkey) } }

    /// A new key generated at start: P-256 for ES256, 2048-bit RSA for RS256.
    public static func generate(algorithm: String) throws(TokenFetchError) -> SigningKey {
        let pkey: OpaquePointer?
        switch algorithm {
        case "ES256": pkey = COpenSSL_generate_ec_key("P-256")
        case "RS256": pkey = COpenSSL_generate_rsa_key(2048)
        default: throw .configuration("cannot generate a key for \(algorithm); give a keyFile")
        }
        guard let pkey else { throw .internalError("key generation failed: \(Crypto.lastError())") }
        return SigningKey(algorithm: algorithm, pkey: pkey)
    }

    /// A key read from `contents`: a PEM private key, or for HS256 the secret bytes themselves
    /// (one trailing newline is dropped, since `echo` adds one).
    public static func load(algorithm: String, contents: [UInt8], path: String) throws(TokenFetchError) -> SigningKey {
        if algorithm == "HS256" {
            var secret = contents
            if secret.last == UInt8(ascii: "\n") { secret.removeLast() }
            guard secret.count >= 32 else {
                throw .configuration("\(path): an HS256 secret needs at least 32 bytes, found \(secret.count)")
            }
            return SigningKey(algorithm: algorithm, pkey: nil, secret: secret)
        }
        let pkey: OpaquePointer? = contents.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let pkey else {
            ERR_clear_error()
            throw .configuration("\(path): not a PEM private key")
        }
        let key = SigningKey(algorithm: algorithm, pkey: pkey)
        let type = EVP_PKEY_get_base_id(pkey)
        switch algorithm {
        case "ES256" where type == EVP_PKEY_EC && EVP_PKEY_get_bits(pkey) == 256: break
        case "RS256" where type == EVP_PKEY_RSA && EVP_PKEY_get_bits(pkey) >= 2048: break
        default:
            throw .configuration("\(path): the key does not fit \(algorithm) (ES256 wants EC P-256, RS256 wants RSA of 2048 bits or more)")
        }
        return key
    }

    /// Signs `message` and returns the JWS signature bytes (for ES256, raw r‖s, not DER).
    public func sign(_ message: [UInt8]) throws(TokenFetchError) -> [UInt8] {
        guard let pkey else { return Crypto.hmacSHA256(key: secret, message: message) }
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
        return algorithm == "ES256" ? try Self.rawECDSA(fromDER: signature) : signature
    }

    /// The public key as JWK members in RFC 7638 order (no `kid`, `use` or `alg`); nil for HS256,
    /// whose secret must never be published.
    public func publicJWKMembers() -> [(String, String)]? {
        guard let pkey else { return nil }
        if algorithm == "ES256" {
            guard let x = bignum(pkey, "qx", width: 32), let y = bignum(pkey, "qy", width: 32) else { return nil }
            return [("crv", "P-256"), ("kty", "EC"), ("x", Base64URL.encode(x)), ("y", Base64URL.encode(y))]
        }
        guard let n = bignum(pkey, "n", width: 0), let e = bignum(pkey, "e", width: 0) else { return nil }
        return [("e", Base64URL.encode(e)), ("kty", "RSA"), ("n", Base64URL.encode(n))]
    }

    /// The RFC 7638 thumbprint, base64url: a stable key id. For HS256, a hash of the secret's hash.
    public func thumbprint() -> String {
        guard let members = publicJWKMembers() else {
            return Base64URL.encode(Crypto.sha256(Crypto.sha256(secret)).prefix(16))
        }
        let canonical = JSONText.object(members.map { ($0.0, JSONText.quoted($0.1)) })
        return Base64URL.encode(Crypto.sha256(Array(canonical.utf8)))
    }

    private func bignum(_ pkey: OpaquePointer, _ name: String, width: Int) -> [UInt8]? {
        var number: OpaquePointer? = nil
        guard EVP_PKEY_get_bn_param(pkey, name, &number) == 1, let number else {
            ERR_clear_error()
            return nil
        }
        defer { BN_free(number) }
        let length = width > 0 ? width : Int((BN_num_bits(number) + 7) / 8)
        var bytes = [UInt8](repeating: 0, count: length)
        guard BN_bn2binpad(number, &bytes, Int32(length)) == Int32(length) else { return nil }
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
        var r: OpaquePointer? = nil, s: OpaquePointer? = nil
        ECDSA_SIG_get0(parsed, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        guard BN_bn2binpad(r, &raw, 32) == 32,
            raw.withUnsafeMutableBufferPointer({ BN_bn2binpad(s, $0.baseAddress! + 32, 32) }) == 32
        else { throw .internalError("ECDSA signature out of range") }
        return raw
    }
}
