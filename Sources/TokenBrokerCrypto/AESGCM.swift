internal import COpenSSL
import TokenBrokerCore

/// AES-256-GCM from OpenSSL's libcrypto: encryption that also authenticates, for the token store's records.
///
/// A 12-byte nonce, fresh from the CSPRNG for every `seal` (random nonces are safe under one key
/// for far more records than a broker writes: NIST SP 800-38D allows 2^32), and a 16-byte tag.
/// `open` gives the plaintext only after the tag has been checked; a record that fails is
/// `nil`, whatever was wrong (the key, the associated data, one changed byte).
public struct AESGCM: Sendable {
    /// The key's length in bytes.
    public static let keyLength = 32
    /// The nonce's length in bytes.
    public static let nonceLength = 12
    /// The tag's length in bytes.
    public static let tagLength = 16

    private let key: [UInt8]

    /// A cipher under `key`, which must be 32 bytes.
    public init?(key: [UInt8]) {
        guard key.count == Self.keyLength else { return nil }
        self.key = key
    }

    /// `nonce ‖ ciphertext ‖ tag` of `plaintext`, authenticating `associatedData` as well.
    /// - Throws: `internalError` when OpenSSL fails (out of memory, its generator broken).
    public func seal(_ plaintext: [UInt8], associatedData: [UInt8]) throws(TokenFetchError) -> [UInt8] {
        let nonce = try Crypto.randomBytes(Self.nonceLength)
        guard let context = EVP_CIPHER_CTX_new() else { throw .internalError("EVP_CIPHER_CTX_new failed") }
        defer { EVP_CIPHER_CTX_free(context) }
        var length: Int32 = 0
        guard let plaintextLength = Int32(exactly: plaintext.count),
            let associatedLength = Int32(exactly: associatedData.count)
        else { throw .internalError("record too large to seal") }
        var output = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written = 0
        guard EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nil, key, nonce) == 1,
            associatedData.isEmpty || EVP_EncryptUpdate(context, nil, &length, associatedData, associatedLength) == 1,
            plaintext.isEmpty || EVP_EncryptUpdate(context, &output, &length, plaintext, plaintextLength) == 1
        else { throw .internalError("AES-256-GCM encryption failed: \(Crypto.lastError())") }
        written = plaintext.isEmpty ? 0 : Int(length)
        let finished = output.withUnsafeMutableBufferPointer { buffer in
            EVP_EncryptFinal_ex(context, buffer.baseAddress! + written, &length)
        }
        guard finished == 1 else { throw .internalError("AES-256-GCM encryption failed: \(Crypto.lastError())") }
        written += Int(length)
        var tag = [UInt8](repeating: 0, count: Self.tagLength)
        guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(Self.tagLength), &tag) == 1 else {
            throw .internalError("AES-256-GCM tag failed: \(Crypto.lastError())")
        }
        return nonce + output[..<written] + tag
    }

    /// The plaintext of `sealed` (as `seal` makes it), or nil when it does not authenticate
    /// under this key and `associatedData`, or is too short to hold a nonce and a tag.
    public func open(_ sealed: [UInt8], associatedData: [UInt8]) -> [UInt8]? {
        guard sealed.count >= Self.nonceLength + Self.tagLength,
            let associatedLength = Int32(exactly: associatedData.count),
            let ciphertextLength = Int32(exactly: sealed.count - Self.nonceLength - Self.tagLength)
        else { return nil }
        let nonce = Array(sealed[..<Self.nonceLength])
        let ciphertext = Array(sealed[Self.nonceLength..<(sealed.count - Self.tagLength)])
        var tag = Array(sealed[(sealed.count - Self.tagLength)...])
        guard let context = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(context) }
        var output = [UInt8](repeating: 0, count: ciphertext.count + 16)
        var length: Int32 = 0
        var written = 0
        guard EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nil, key, nonce) == 1,
            associatedData.isEmpty || EVP_DecryptUpdate(context, nil, &length, associatedData, associatedLength) == 1,
            ciphertext.isEmpty || EVP_DecryptUpdate(context, &output, &length, ciphertext, ciphertextLength) == 1
        else {
            ERR_clear_error()
            return nil
        }
        written = ciphertext.isEmpty ? 0 : Int(length)
        guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, Int32(Self.tagLength), &tag) == 1 else {
            ERR_clear_error()
            return nil
        }
        // The tag is checked here: a failure means the record is not what was sealed.
        let verified = output.withUnsafeMutableBufferPointer { buffer in
            EVP_DecryptFinal_ex(context, buffer.baseAddress! + written, &length)
        }
        guard verified == 1 else {
            ERR_clear_error()
            return nil
        }
        written += Int(length)
        return Array(output[..<written])
    }
}
