import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerSources
import TokenBrokerTestSupport

/// The local signer's tokens, checked by the `openssl` command line rather than by our own code.
@Suite struct JWTSignerTests {
    @Test(arguments: [JWSAlgorithm.es256, .rs256])
    func tokensSignedWithAKeyFileVerifyWithOpenSSL(_ algorithm: JWSAlgorithm) throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("key.pem")
        let generate =
            algorithm == .es256
            ? ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyPath]
            : ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", keyPath]
        try OpenSSL.run(generate)
        try OpenSSL.run(["pkey", "-in", keyPath, "-pubout", "-out", directory.path("public.pem")])

        let signer = try JWTSigner(
            configuration: JWTSourceConfiguration(
                algorithm: algorithm, keyFile: keyPath, audience: "api", lifetimeSec: 600))
        let token = try signer.mint(now: WallTime(timeIntervalSince1970: 1_800_000_000))
        let parts = token.accessToken.split(separator: ".").map(String.init)
        #expect(parts.count == 3)

        var signature = try #require(Base64URL.decode(parts[2]))
        if algorithm == .es256 {
            #expect(signature.count == 64)
            signature = DER.ecdsaSignature(raw: signature)
        }
        try Data((parts[0] + "." + parts[1]).utf8).write(to: URL(fileURLWithPath: directory.path("input")))
        try Data(signature).write(to: URL(fileURLWithPath: directory.path("signature")))
        let verdict = try OpenSSL.run([
            "dgst", "-sha256", "-verify", directory.path("public.pem"), "-signature", directory.path("signature"),
            directory.path("input"),
        ])
        #expect(verdict.contains("Verified OK"))

        let claims =
            try JSONSerialization.jsonObject(with: Data(try #require(Base64URL.decode(parts[1])))) as? [String: Any]
        #expect(claims?["aud"] as? String == "api")
        #expect(claims?["iat"] as? Int == 1_800_000_000)
        #expect(claims?["exp"] as? Int == 1_800_000_600)
        #expect((claims?["jti"] as? String)?.isEmpty == false)
        let header =
            try JSONSerialization.jsonObject(with: Data(try #require(Base64URL.decode(parts[0])))) as? [String: Any]
        #expect(header?["alg"] as? String == algorithm.rawValue)
        #expect(header?["kid"] as? String == signer.keyID)
        #expect(token.lifetime == .seconds(600))
    }

    @Test func hs256MatchesOpenSSLsHMAC() throws {
        let directory = try TemporaryDirectory()
        let secret = String(repeating: "k", count: 40)
        try Data((secret + "\n").utf8).write(to: URL(fileURLWithPath: directory.path("secret")))
        let signer = try JWTSigner(
            configuration: JWTSourceConfiguration(algorithm: .hs256, keyFile: directory.path("secret")))
        let parts = try signer.mint(now: WallTime()).accessToken.split(separator: ".").map(String.init)
        try Data((parts[0] + "." + parts[1]).utf8).write(to: URL(fileURLWithPath: directory.path("input")))
        let output = try OpenSSL.run([
            "dgst", "-sha256", "-hmac", secret, "-binary", "-out", directory.path("mac"), directory.path("input"),
        ])
        _ = output
        let expected = try Data(contentsOf: URL(fileURLWithPath: directory.path("mac")))
        #expect(Base64URL.decode(parts[2]) == [UInt8](expected))
        #expect(JWTSigner.jwks([signer]) == #"{"keys":[]}"#, "an HMAC secret is never published")
    }

    @Test func eachTokenHasItsOwnJTI() throws {
        let signer = try JWTSigner(configuration: JWTSourceConfiguration())
        let ids = try (0..<50).map { _ in try signer.mint(now: WallTime()).accessToken.split(separator: ".")[1] }
        #expect(Set(ids).count == 50)
    }

    @Test func aKeyOfTheWrongKindIsRefusedWithItsPath() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("rsa.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", keyPath])
        #expect {
            try JWTSigner(configuration: JWTSourceConfiguration(algorithm: .es256, keyFile: keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains("rsa.pem: the key does not fit ES256") == true
        }
        #expect(throws: TokenFetchError.self) {
            try JWTSigner(
                configuration: JWTSourceConfiguration(algorithm: .es256, keyFile: directory.path("missing.pem")))
        }
    }

    /// 256-bit curves that are not P-256: OpenSSL reports 256 bits for them too, but no ES256
    /// verifier accepts their signatures, and their JWK would claim `"crv":"P-256"`.
    @Test(arguments: ["secp256k1", "brainpoolP256r1"])
    func es256RefusesOtherCurvesOf256Bits(_ curve: String) throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("\(curve).pem")
        try OpenSSL.run(["ecparam", "-name", curve, "-genkey", "-noout", "-out", keyPath])
        #expect {
            try JWTSigner(configuration: JWTSourceConfiguration(algorithm: .es256, keyFile: keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains(
                "\(curve).pem: the key does not fit ES256: it is EC on the \(curve) curve; ES256 wants EC on the P-256 curve"
            )
                == true
        }
        // An EC key signs a private_key_jwt client's assertions with ES256: the error is ES256's.
        #expect {
            try OAuth2TokenSource(configuration: Self.privateKeyJWT(keyPath))
        } throws: { error in
            let detail = (error as? TokenFetchError)?.detail ?? ""
            return detail.contains("\(curve).pem: the key does not fit ES256: it is EC on the \(curve) curve")
                && !detail.contains("RS256")
        }
    }

    @Test func es256AcceptsP256WrittenAsNamedCurveParameters() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("p256.pem")
        try OpenSSL.run(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", keyPath])
        let signer = try JWTSigner(configuration: JWTSourceConfiguration(algorithm: .es256, keyFile: keyPath))
        #expect(JWTSigner.jwks([signer]).contains(#""crv":"P-256""#))
        _ = try OAuth2TokenSource(configuration: Self.privateKeyJWT(keyPath))
    }

    @Test func rs256RefusesRSAKeysUnder2048Bits() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("rsa1024.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", keyPath])
        #expect {
            try JWTSigner(configuration: JWTSourceConfiguration(algorithm: .rs256, keyFile: keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains(
                "rsa1024.pem: the key does not fit RS256: it is RSA of 1024 bits; RS256 wants RSA of 2048 bits or more")
                == true
        }
        #expect {
            try OAuth2TokenSource(configuration: Self.privateKeyJWT(keyPath))
        } throws: { error in
            let detail = (error as? TokenFetchError)?.detail ?? ""
            return detail.contains("rsa1024.pem: the key does not fit RS256: it is RSA of 1024 bits")
                && !detail.contains("ES256")
        }
    }

    @Test func privateKeyJWTNamesAKeyOfNeitherKind() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("ed25519.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "ED25519", "-out", keyPath])
        #expect {
            try OAuth2TokenSource(configuration: Self.privateKeyJWT(keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains(
                "ed25519.pem: the key does not fit private_key_jwt: it is an ED25519 key; it signs with ES256") == true
        }
    }

    // MARK: - The JWKS

    @Test func anHS256SignerNeverHidesAPublishedKeyUnderItsKid() throws {
        let directory = try TemporaryDirectory()
        try Data(String(repeating: "s", count: 40).utf8).write(to: URL(fileURLWithPath: directory.path("secret")))
        let hmac = try JWTSigner(
            configuration: JWTSourceConfiguration(algorithm: .hs256, keyFile: directory.path("secret"), keyID: "k"))
        let ec = try JWTSigner(configuration: JWTSourceConfiguration(keyID: "k"))
        #expect(JWTSigner.jwks([hmac, ec]) == #"{"keys":["# + (ec.publicJWK ?? "") + "]}")
        #expect(!ec.publishesAnotherKey(underTheKeyIDOf: hmac) && !hmac.publishesAnotherKey(underTheKeyIDOf: ec))
    }

    @Test func eachKeyIsPublishedOnceUnderEachOfItsKids() throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("key.pem")
        try OpenSSL.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyPath])
        let first = try JWTSigner(configuration: JWTSourceConfiguration(keyFile: keyPath, keyID: "a"))
        let again = try JWTSigner(configuration: JWTSourceConfiguration(keyFile: keyPath, keyID: "a", audience: "x"))
        let renamed = try JWTSigner(configuration: JWTSourceConfiguration(keyFile: keyPath, keyID: "b"))
        let other = try JWTSigner(configuration: JWTSourceConfiguration(keyID: "a"))
        let kids = try #require(
            JSONSerialization.jsonObject(with: Data(JWTSigner.jwks([first, again, renamed]).utf8))
                as? [String: [[String: Any]]])
        #expect(kids["keys"]?.map { $0["kid"] as? String } == ["a", "b"])
        #expect(!again.publishesAnotherKey(underTheKeyIDOf: first), "the same key under the same kid")
        #expect(!renamed.publishesAnotherKey(underTheKeyIDOf: first), "the same key under another kid")
        #expect(other.publishesAnotherKey(underTheKeyIDOf: first) && first.publishesAnotherKey(underTheKeyIDOf: other))
    }

    @Test(arguments: [JWSAlgorithm.es256, .rs256])
    func theShortestTokenIsAsLongAsEveryTokenOfTheSigner(_ algorithm: JWSAlgorithm) throws {
        let signer = try JWTSigner(configuration: JWTSourceConfiguration(algorithm: algorithm, audience: "api"))
        let length = try signer.shortestTokenBytes(audienceAsked: false)
        #expect(try (0..<5).allSatisfy { _ in try signer.mint(now: WallTime()).accessToken.utf8.count == length })
        // A child asked for an audience carries it in place of "api": the shortest is an empty one.
        let child = signer.child(for: TokenRequestValues(audience: ""))
        #expect(
            try signer.shortestTokenBytes(audienceAsked: true) == child.mint(now: WallTime()).accessToken.utf8.count)
        #expect(try signer.shortestTokenBytes(audienceAsked: true) < length)
    }

    /// OpenSSL's default pass-phrase callback reads the controlling terminal; the broker's never asks.
    @Test(arguments: ["EC", "RSA"])
    func aPassphraseProtectedKeyIsRefusedNamingTheFile(_ algorithm: String) throws {
        let directory = try TemporaryDirectory()
        let keyPath = directory.path("locked.pem")
        let options =
            algorithm == "EC" ? ["-pkeyopt", "ec_paramgen_curve:P-256"] : ["-pkeyopt", "rsa_keygen_bits:2048"]
        try OpenSSL.run(
            ["genpkey", "-algorithm", algorithm] + options + ["-aes256", "-pass", "pass:x", "-out", keyPath])
        #expect {
            try JWTSigner(
                configuration: JWTSourceConfiguration(algorithm: algorithm == "EC" ? .es256 : .rs256, keyFile: keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains("locked.pem: the key is protected by a pass phrase") == true
        }
        #expect {
            try OAuth2TokenSource(configuration: Self.privateKeyJWT(keyPath))
        } throws: { error in
            (error as? TokenFetchError)?.detail.contains("locked.pem: the key is protected by a pass phrase") == true
        }
    }

    private static func privateKeyJWT(_ keyPath: String) -> OAuth2SourceConfiguration {
        var settings = OAuth2SourceConfiguration(tokenURL: "https://issuer.example/token", clientID: "client")
        settings.clientAuth = .privateKeyJWT
        settings.privateKeyFile = keyPath
        return settings
    }

    @Test func hs256KeyIDIsAHashOfTheSecretsHashAsTheREADMESays() throws {
        let directory = try TemporaryDirectory()
        let secret = String(repeating: "s", count: 32)
        try Data(secret.utf8).write(to: URL(fileURLWithPath: directory.path("secret")))
        let signer = try JWTSigner(
            configuration: JWTSourceConfiguration(algorithm: .hs256, keyFile: directory.path("secret")))
        try OpenSSL.run(["dgst", "-sha256", "-binary", "-out", directory.path("once"), directory.path("secret")])
        try OpenSSL.run(["dgst", "-sha256", "-binary", "-out", directory.path("twice"), directory.path("once")])
        let twice = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.path("twice"))))
        #expect(signer.keyID == Base64URL.encode(twice.prefix(16)))
    }

    @Test func theThumbprintMatchesRFC7638sExample() throws {
        // RFC 7638 §3.1: this RSA key's thumbprint is NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs.
        let n =
            "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"
        let canonical = #"{"e":"AQAB","kty":"RSA","n":"\#(n)"}"#
        #expect(
            Base64URL.encode(try Crypto.sha256(Array(canonical.utf8))) == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
    }

    @Test func fingerprintsMatchSha256sum() throws {
        let secret = "correct horse battery staple"
        let directory = try TemporaryDirectory()
        try Data(secret.utf8).write(to: URL(fileURLWithPath: directory.path("secret")))
        let hex = try OpenSSL.run(["dgst", "-sha256", "-r", directory.path("secret")]).prefix(12)
        #expect(Fingerprint.of(secret) == "sha256:" + hex)
        #expect(!Fingerprint.of(secret).contains(secret))
    }
}
