internal import COpenSSL
import TokenBrokerCore

/// Checks the TLS files of an issuer or a proxy target (`caFile`, `clientCertFile`,
/// `clientKeyFile`) when the configuration is loaded: at start, by `--check-config` and at a
/// reload.
///
/// The upstream client reads them again when they change (`TLSFileCache`), as bytes it hands to
/// libcurl, and a file that turns out wrong then fails its exchange alone. So each is read here
/// as every other file is (`FileContents`: a regular file, within a size limit, never waited
/// on), and parsed: the CA and certificate files must hold PEM certificates, the key a PEM
/// private key without a pass phrase, matching the certificate.
public enum TLSFiles {
    /// The largest CA file read (`UpstreamConfiguration.caFileLimit`, as the upstream client reads it).
    public static let caFileLimit = UpstreamConfiguration.caFileLimit

    /// Throws a `configuration` error naming the file and what is wrong with it.
    public static func check(_ upstream: UpstreamConfiguration) throws(TokenFetchError) {
        if let path = upstream.caFile {
            let certificates = try Self.certificates(in: try SecretFile.read(path, limit: caFileLimit), path: path)
            for certificate in certificates { X509_free(certificate) }
        }
        guard let certificatePath = upstream.clientCertFile, let keyPath = upstream.clientKeyFile else { return }
        // The limit the upstream client reads them with.
        let limit = UpstreamConfiguration.clientFileLimit
        let chain = try Self.certificates(in: try SecretFile.read(certificatePath, limit: limit), path: certificatePath)
        defer { for certificate in chain { X509_free(certificate) } }
        let key = try SigningKey.readPrivateKey(try SecretFile.read(keyPath, limit: limit), path: keyPath)
        defer { EVP_PKEY_free(key) }
        // The first certificate is the client's own; libcurl refuses a key that is not its.
        guard X509_check_private_key(chain[0], key) == 1 else {
            ERR_clear_error()
            throw .configuration("\(keyPath): the key does not match the certificate in \(certificatePath)")
        }
    }

    /// Every PEM certificate in `contents`, in order (the caller frees them); at least one, and a
    /// certificate block that does not parse is an error, as it would be to OpenSSL at connection.
    private static func certificates(in contents: [UInt8], path: String) throws(TokenFetchError) -> [OpaquePointer] {
        guard let length = Int32(exactly: contents.count) else {
            throw .configuration("\(path): holds no PEM certificate")
        }
        var certificates: [OpaquePointer] = []
        var complete = false
        contents.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, length) else { return }
            defer { BIO_free(bio) }
            // Blocks of other kinds (a key, parameters) are passed over; the end of the text shows
            // as "no start line", any other error as a certificate that does not parse. The `AUX`
            // reader takes OpenSSL's "TRUSTED CERTIFICATE" blocks too (RHEL's ca-bundle.trust.crt),
            // as OpenSSL does when libcurl has it load the file.
            while let certificate = PEM_read_bio_X509_AUX(bio, nil, nil, nil) { certificates.append(certificate) }
            let reason = ERR_GET_REASON(ERR_peek_last_error())
            complete = reason == PEM_R_NO_START_LINE
            ERR_clear_error()
        }
        guard complete, !certificates.isEmpty else {
            for certificate in certificates { X509_free(certificate) }
            throw .configuration(
                certificates.isEmpty && complete
                    ? "\(path): holds no PEM certificate" : "\(path): a certificate in it does not parse")
        }
        return certificates
    }
}
