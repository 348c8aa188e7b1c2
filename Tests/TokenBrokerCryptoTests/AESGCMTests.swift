import Foundation
import Testing
import TokenBrokerCrypto
import TokenBrokerTestSupport

/// AES-256-GCM as the token store seals its records (`nonce ‖ ciphertext ‖ tag`): checked against
/// the published GCM test vectors and the `openssl` command line, and against every way a
/// record can be wrong.
@Suite struct AESGCMTests {
    private static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    private static func bytes(_ hex: String) -> [UInt8] {
        let digits = Array(hex.utf8)
        return stride(from: 0, to: digits.count, by: 2).map {
            UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)!
        }
    }

    private static let key = (0..<32).map { UInt8($0 &* 7 &+ 3) }
    private static let associatedData = Array("TBSTORE1\0\0\0\0\0\0\0\u{7}orders".utf8)

    private static func cipher(_ key: [UInt8] = key) -> AESGCM {
        AESGCM(key: key)!
    }

    /// A published test vector: key, nonce, associated data, plaintext, ciphertext and tag, in hex.
    struct Vector: Sendable, CustomTestStringConvertible {
        let name: String
        let key: String
        let nonce: String
        let associatedData: String
        let plaintext: String
        let ciphertext: String
        let tag: String
        var testDescription: String { name }
    }

    /// The AES-256 test cases of McGrew and Viega, "The Galois/Counter Mode of Operation (GCM)"
    /// (the GCM specification submitted to NIST, appendix B), with 96-bit nonces: 13 (nothing to
    /// encrypt), 14 (one zero block) and 16 (60 bytes, with 20 bytes of associated data). The
    /// values were checked when this test was written against Python's `cryptography` package
    /// (`AESGCM(key).encrypt(nonce, plaintext, aad)` gives `ciphertext ‖ tag`), another
    /// implementation than this one.
    static let vectors = [
        Vector(
            name: "test case 13", key: String(repeating: "00", count: 32), nonce: String(repeating: "00", count: 12),
            associatedData: "", plaintext: "", ciphertext: "", tag: "530f8afbc74536b9a963b4f1c4cb738b"),
        Vector(
            name: "test case 14", key: String(repeating: "00", count: 32), nonce: String(repeating: "00", count: 12),
            associatedData: "", plaintext: String(repeating: "00", count: 16),
            ciphertext: "cea7403d4d606b6e074ec5d3baf39d18", tag: "d0d1c8a799996bf0265b98b5d48ab919"),
        Vector(
            name: "test case 16",
            key: "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
            nonce: "cafebabefacedbaddecaf888",
            associatedData: "feedfacedeadbeeffeedfacedeadbeefabaddad2",
            plaintext: "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
                + "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
            ciphertext: "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
                + "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
            tag: "76fc6ece0f4e1768cddf8853bb2d551b"),
    ]

    @Test(arguments: vectors)
    func thePublishedVectorsOpenToTheirPlaintext(vector: Vector) throws {
        let cipher = try #require(AESGCM(key: Self.bytes(vector.key)))
        let sealed = Self.bytes(vector.nonce + vector.ciphertext + vector.tag)
        let associatedData = Self.bytes(vector.associatedData)
        let opened = try #require(cipher.open(sealed, associatedData: associatedData))
        #expect(Self.hex(opened) == vector.plaintext)

        // Any changed byte of the vector, and any other associated data, fails.
        for index in sealed.indices {
            var changed = sealed
            changed[index] ^= 0x01
            #expect(cipher.open(changed, associatedData: associatedData) == nil, "byte \(index) changed")
        }
        #expect(cipher.open(sealed, associatedData: associatedData + [0]) == nil)
    }

    @Test(arguments: [0, 1, 15, 16, 17, 1000, 65_536])
    func aSealedRecordOpensToWhatWasSealed(length: Int) throws {
        let plaintext = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let cipher = Self.cipher()
        for associatedData in [[], Self.associatedData] {
            let sealed = try cipher.seal(plaintext, associatedData: associatedData)
            #expect(sealed.count == AESGCM.nonceLength + length + AESGCM.tagLength)
            #expect(cipher.open(sealed, associatedData: associatedData) == plaintext)
            #expect(AESGCM(key: Self.key)?.open(sealed, associatedData: associatedData) == plaintext, "a second cipher")
        }
    }

    @Test func aChangedByteAnywhereFailsToOpen() throws {
        let cipher = Self.cipher()
        let plaintext = Array(#"{"access_token":"secret-token","token_type":"Bearer"}"#.utf8)
        let sealed = try cipher.seal(plaintext, associatedData: Self.associatedData)
        for index in sealed.indices {
            for flip: UInt8 in [0x01, 0x80, 0xFF] {
                var changed = sealed
                changed[index] ^= flip
                let part =
                    index < AESGCM.nonceLength
                    ? "nonce" : index < sealed.count - AESGCM.tagLength ? "ciphertext" : "tag"
                #expect(
                    cipher.open(changed, associatedData: Self.associatedData) == nil,
                    "byte \(index) (\(part)) xor \(flip)")
            }
        }
        #expect(cipher.open(sealed, associatedData: Self.associatedData) == plaintext, "the original still opens")
    }

    @Test func otherAssociatedDataFailsToOpen() throws {
        let cipher = Self.cipher()
        let data = Self.associatedData
        let sealed = try cipher.seal(Array("token".utf8), associatedData: data)
        var oneByteChanged = data
        oneByteChanged[15] ^= 1
        for other in [[], Array(data.dropLast()), data + [0], oneByteChanged, Array("TBSTORE1".utf8)] {
            #expect(cipher.open(sealed, associatedData: other) == nil, "associated data \(Self.hex(other))")
        }
        let unbound = try cipher.seal(Array("token".utf8), associatedData: [])
        #expect(cipher.open(unbound, associatedData: data) == nil, "sealed without, opened with")
    }

    @Test func anotherKeyFailsToOpen() throws {
        let sealed = try Self.cipher().seal(Array("token".utf8), associatedData: Self.associatedData)
        var nearly = Self.key
        nearly[31] ^= 1
        for key in [nearly, [UInt8](repeating: 0, count: 32), try Crypto.randomBytes(32)] {
            #expect(Self.cipher(key).open(sealed, associatedData: Self.associatedData) == nil)
        }
    }

    @Test func truncatedOrExtendedRecordsFailToOpen() throws {
        let cipher = Self.cipher()
        let sealed = try cipher.seal(Array("token".utf8), associatedData: [])
        #expect(cipher.open(Array(sealed.dropLast()), associatedData: []) == nil)
        #expect(cipher.open(Array(sealed.dropFirst()), associatedData: []) == nil)
        #expect(cipher.open(sealed + [0], associatedData: []) == nil)
        for length in 0..<(AESGCM.nonceLength + AESGCM.tagLength) {
            #expect(cipher.open(Array(sealed.prefix(length)), associatedData: []) == nil, "\(length) bytes")
        }
        let empty = try cipher.seal([], associatedData: [])
        #expect(empty.count == AESGCM.nonceLength + AESGCM.tagLength)
        #expect(cipher.open(empty, associatedData: []) == [])
        #expect(cipher.open(Array(empty.dropLast()), associatedData: []) == nil)
    }

    @Test func everySealHasAFreshNonce() throws {
        let cipher = Self.cipher()
        let plaintext = Array("the same token".utf8)
        let seals = try (0..<64).map { _ in try cipher.seal(plaintext, associatedData: Self.associatedData) }
        let nonces = Set(seals.map { Array($0.prefix(AESGCM.nonceLength)) })
        #expect(nonces.count == seals.count, "96 random bits collide with probability about 2^-85 here")
        #expect(Set(seals).count == seals.count, "the same plaintext never seals to the same bytes")
        for sealed in seals { #expect(cipher.open(sealed, associatedData: Self.associatedData) == plaintext) }
    }

    @Test(arguments: [0, 1, 16, 24, 31, 33, 64])
    func aKeyOfAnotherLengthThan32IsRefused(length: Int) {
        #expect(AESGCM(key: [UInt8](repeating: 7, count: length)) == nil)
    }

    @Test func aKeyOf32BytesIsTaken() {
        #expect(AESGCM(key: [UInt8](repeating: 7, count: 32)) != nil)
        #expect(AESGCM.keyLength == 32 && AESGCM.nonceLength == 12 && AESGCM.tagLength == 16)
    }

    /// What `seal` writes, rebuilt with the `openssl` command line from its nonce: the
    /// ciphertext is AES-256-CTR from the counter block `nonce ‖ 00000002` (GCM's first block
    /// after J0), and with nothing to encrypt the tag is the GMAC of the associated data.
    @Test func sealAgreesWithTheOpenSSLCommandLine() throws {
        let folder = try TemporaryDirectory()
        let cipher = Self.cipher()
        let plaintext = Array(#"{"access_token":"abc.def.ghi","token_type":"Bearer","issued_at_ms":1}"#.utf8)
        let sealed = try cipher.seal(plaintext, associatedData: Self.associatedData)
        let nonce = Array(sealed.prefix(AESGCM.nonceLength))
        let ciphertext = Array(sealed[AESGCM.nonceLength..<(sealed.count - AESGCM.tagLength)])
        let plainPath = folder.path("plain")
        let outPath = folder.path("out")
        try Data(plaintext).write(to: URL(fileURLWithPath: plainPath))
        try OpenSSL.run([
            "enc", "-aes-256-ctr", "-K", Self.hex(Self.key), "-iv", Self.hex(nonce) + "00000002", "-in", plainPath,
            "-out", outPath,
        ])
        #expect(Array(try Data(contentsOf: URL(fileURLWithPath: outPath))) == ciphertext)

        let tagOnly = try cipher.seal([], associatedData: Self.associatedData)
        let dataPath = folder.path("associated")
        try Data(Self.associatedData).write(to: URL(fileURLWithPath: dataPath))
        let gmac = try OpenSSL.run([
            "mac", "-cipher", "AES-256-GCM", "-macopt", "hexkey:" + Self.hex(Self.key), "-macopt",
            "hexiv:" + Self.hex(Array(tagOnly.prefix(AESGCM.nonceLength))), "-in", dataPath, "GMAC",
        ])
        #expect(
            gmac.trimmingCharacters(in: .whitespacesAndNewlines).lowercased()
                == Self.hex(Array(tagOnly.suffix(AESGCM.tagLength))))
    }
}
