import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerCrypto
import TokenBrokerTestSupport

@testable import TokenBrokerStore

/// A record's format: sealed under the store's key and bound to its own record key and version;
/// every other record is refused with a reason that never quotes the token.
@Suite struct StoreRecordTests {
    private static let key = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
    private static let secret = "eyJhbGciOiJFUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2lnbmF0dXJl"

    private static func sealer(_ key: [UInt8] = key) -> StoreRecord { StoreRecord(cipher: AESGCM(key: key)!) }

    /// A time of whole milliseconds, as a record keeps it.
    private static func time(milliseconds: Int) -> WallTime {
        WallTime(timeIntervalSince1970: Double(milliseconds) / 1000)
    }

    private static let token = StoredToken(
        accessToken: secret, tokenType: "Bearer", scope: "read write", version: 42,
        issuedAt: time(milliseconds: 1_700_000_000_123), expiresAt: time(milliseconds: 1_700_000_900_123))

    /// The reason `bytes` is refused under `key`; records the issue when it is accepted.
    private func refusal(_ bytes: [UInt8], key: String = "orders", sealer: StoreRecord = sealer()) -> String? {
        switch sealer.open(bytes, key: key) {
        case .success:
            Issue.record("the record should be refused")
            return nil
        case .failure(let problem):
            #expect(!problem.description.contains(Self.secret), "the reason quotes the token")
            #expect(!problem.description.contains("c2VjcmV0"), "the reason quotes part of the token")
            return problem.description
        }
    }

    /// Bytes sealed by hand as `StoreRecord` does, around any plaintext: what a holder of the key could write.
    private func forged(_ plaintext: String, version: UInt64 = 1, key: String = "orders") throws -> [UInt8] {
        let header = StoreRecord.magic + (0..<8).reversed().map { UInt8(truncatingIfNeeded: version >> (8 * $0)) }
        return header
            + (try AESGCM(key: Self.key)!.seal(Array(plaintext.utf8), associatedData: header + Array(key.utf8)))
    }

    @Test func aSealedRecordOpensToTheSameToken() throws {
        let sealer = Self.sealer()
        let variants = [
            Self.token,
            StoredToken(
                accessToken: "t", tokenType: "DPoP", scope: nil, version: 1, issuedAt: Self.time(milliseconds: 0),
                expiresAt: nil),
            StoredToken(
                accessToken: #"quote" back\slash \#u{1} é \#u{7F}"#, tokenType: "Bearer", scope: "",
                version: StoreRecord.versionLimit - 1,
                issuedAt: Self.time(milliseconds: StoreRecord.latestMilliseconds),
                expiresAt: Self.time(milliseconds: StoreRecord.latestMilliseconds)),
        ]
        for token in variants {
            let sealed = try sealer.seal(token, key: "orders")
            #expect(try sealer.open(sealed, key: "orders").get() == token)
            #expect(try Self.sealer(Self.key).open(sealed, key: "orders").get() == token, "another instance, same key")
        }
    }

    @Test func theHeaderIsTheFormatThenTheVersionBigEndian() throws {
        var token = Self.token
        token.version = 0x0102_0304_0506_0708
        let sealed = try Self.sealer().seal(token, key: "orders")
        #expect(Array(sealed.prefix(8)) == Array("TBSTORE1".utf8))
        #expect(Array(sealed[8..<16]) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(StoreRecord.header(version: 42) == Array("TBSTORE1".utf8) + [0, 0, 0, 0, 0, 0, 0, 42])
        #expect(sealed.count < StoreRecord.maximumSize)
    }

    /// The plaintext, opened with the cipher alone: the token's fields, times in milliseconds,
    /// the settings' digest, and nothing else.
    @Test func thePlaintextHoldsOnlyWhatTokenShows() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        let plaintext = try #require(
            AESGCM(key: Self.key)!.open(
                Array(sealed[16...]), associatedData: Array(sealed[..<16]) + Array("orders".utf8)))
        guard case .object(let members) = try JSONValue(parsing: plaintext) else {
            Issue.record("the plaintext should be a JSON object")
            return
        }
        #expect(
            members == [
                "access_token": .string(Self.secret), "token_type": .string("Bearer"), "scope": .string("read write"),
                "issued_at_ms": .number(1_700_000_000_123), "expires_at_ms": .number(1_700_000_900_123),
                "settings": .string(""),
            ])
        var bare = Self.token
        bare.scope = nil
        bare.expiresAt = nil
        let sealedBare = try Self.sealer().seal(bare, key: "orders")
        let plainBare = try #require(
            AESGCM(key: Self.key)!.open(
                Array(sealedBare[16...]), associatedData: Array(sealedBare[..<16]) + Array("orders".utf8)))
        guard case .object(let bareMembers) = try JSONValue(parsing: plainBare) else { return }
        #expect(Set(bareMembers.keys) == ["access_token", "token_type", "issued_at_ms", "settings"])
    }

    @Test func timesAreKeptToTheMillisecond() throws {
        var token = Self.token
        token.issuedAt = WallTime(timeIntervalSince1970: 1_700_000_000.123_4)
        token.expiresAt = WallTime(timeIntervalSince1970: 1_700_000_000.999_6)
        let opened = try Self.sealer().open(try Self.sealer().seal(token, key: "orders"), key: "orders").get()
        #expect(opened.issuedAt == Self.time(milliseconds: 1_700_000_000_123))
        #expect(opened.expiresAt == Self.time(milliseconds: 1_700_000_001_000))
    }

    @Test func theRecordIsNotInClear() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        for secret in [Self.secret, "c2VjcmV0", "read write", "Bearer", "orders", "issued_at_ms"] {
            #expect(!Data(sealed).contains(Data(secret.utf8)), "\(secret) appears in clear")
        }
    }

    @Test func anotherStoreKeyIsRefused() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        var other = Self.key
        other[0] ^= 1
        #expect(
            refusal(sealed, sealer: Self.sealer(other))
                == "does not authenticate: sealed under another key, for another provider, or changed")
    }

    @Test func anotherProvidersRecordIsRefused() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        for key in ["billing", "orders ", "Orders", "", "orders\naudience=https://api.example"] {
            #expect(refusal(sealed, key: key)?.hasPrefix("does not authenticate") == true, "key \(key)")
        }
        let child = try Self.sealer().seal(Self.token, key: "t\naudience=https://a.example")
        #expect(refusal(child, key: "t\naudience=https://b.example")?.hasPrefix("does not authenticate") == true)
        #expect(refusal(child, key: "t")?.hasPrefix("does not authenticate") == true)
    }

    @Test(arguments: 8..<16)
    func aChangedVersionByteIsRefused(index: Int) throws {
        var sealed = try Self.sealer().seal(Self.token, key: "orders")
        sealed[index] ^= 0x01
        #expect(refusal(sealed)?.hasPrefix("does not authenticate") == true)
    }

    @Test func aChangedByteAfterTheHeaderIsRefused() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        for index in 16..<sealed.count {
            var changed = sealed
            changed[index] ^= 0x40
            #expect(refusal(changed)?.hasPrefix("does not authenticate") == true, "byte \(index)")
        }
    }

    @Test func aTruncatedRecordIsRefused() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        for length in [0, 1, 7, 8, 15] {
            #expect(
                refusal(Array(sealed.prefix(length)))
                    == "is not a token-broker store record (its first bytes are not TBSTORE1)", "\(length) bytes")
        }
        for length in [16, 17, 27, 28, 43, sealed.count - 1] {
            #expect(
                refusal(Array(sealed.prefix(length)))?.hasPrefix("does not authenticate") == true, "\(length) bytes")
        }
        #expect(refusal(sealed + [0])?.hasPrefix("does not authenticate") == true, "a byte added")
    }

    @Test func aWrongMagicIsRefused() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        for index in 0..<8 {
            var changed = sealed
            changed[index] ^= 0x20
            #expect(
                refusal(changed) == "is not a token-broker store record (its first bytes are not TBSTORE1)",
                "byte \(index)")
        }
        #expect(refusal(Array("TBSTORE2".utf8) + sealed[8...])?.hasPrefix("is not a token-broker store record") == true)
        #expect(refusal(Array(Self.secret.utf8))?.hasPrefix("is not a token-broker store record") == true)
    }

    @Test func anOversizeRecordIsRefusedUnread() throws {
        let sealed = try Self.sealer().seal(Self.token, key: "orders")
        let padded = sealed + [UInt8](repeating: 0, count: StoreRecord.maximumSize - sealed.count + 1)
        #expect(refusal(padded) == "is larger than any record")
        #expect(refusal(Array(Self.secret.utf8) + padded) == "is larger than any record")
        let atTheLimit = sealed + [UInt8](repeating: 0, count: StoreRecord.maximumSize - sealed.count)
        #expect(refusal(atTheLimit)?.hasPrefix("does not authenticate") == true, "the limit itself is read")
    }

    /// A record `open` would refuse (an issuer's huge `scope`) is not sealed: a store would keep it
    /// and never read it back.
    @Test func aRecordLargerThanAnyRecordReadIsNotSealed() throws {
        let sealer = Self.sealer()
        var token = Self.token
        token.scope = String(repeating: "s", count: StoreRecord.maximumSize)
        do {
            _ = try sealer.seal(token, key: "orders")
            Issue.record("a record over \(StoreRecord.maximumSize) bytes should not be sealed")
        } catch {
            #expect(error.summary.contains("larger than \(StoreRecord.maximumSize) bytes"), "\(error.summary)")
            #expect(!error.summary.contains(Self.secret))
        }
        // Just under the limit: sealed, and read back.
        let overhead = try sealer.seal(Self.token, key: "orders").count - (Self.token.scope ?? "").utf8.count
        token.scope = String(repeating: "s", count: StoreRecord.maximumSize - overhead)
        let sealed = try sealer.seal(token, key: "orders")
        #expect(sealed.count == StoreRecord.maximumSize)
        #expect(try sealer.open(sealed, key: "orders").get() == token)
    }

    @Test func versionZeroIsRefused() throws {
        var token = Self.token
        token.version = 0
        let sealed = try Self.sealer().seal(token, key: "orders")
        #expect(refusal(sealed) == "names version 0")
    }

    /// Versions have at most 15 digits: a provider's go on from a record's, so a record of
    /// 2^64 - 1 (written by something else with the key) once made the next token trap on the
    /// addition, at every start of a broker whose store kept it; one of 10^15 made versions that
    /// the API refuses to read back.
    @Test(arguments: [StoreRecord.versionLimit, StoreRecord.versionLimit + 1, UInt64.max])
    func aVersionOfMoreThanFifteenDigitsIsRefused(_ version: UInt64) throws {
        var token = Self.token
        token.version = version
        let sealed = try Self.sealer().seal(token, key: "orders")
        #expect(refusal(sealed) == "names a version of more than 15 digits")
    }

    @Test func anAuthenticRecordThatHoldsNoTokenIsRefused() throws {
        let noToken = "authenticates but does not hold a token (a newer format?)"
        for plaintext in [
            "", "[]", "not json", #"{"token_type":"Bearer","issued_at_ms":1}"#,
            #"{"access_token":"","token_type":"Bearer","issued_at_ms":1}"#,
            #"{"access_token":"\#(Self.secret)","issued_at_ms":1}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"","issued_at_ms":1}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer"}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":-1}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":1.5}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":"1"}"#,
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":253402300800000}"#,
            #"{"access_token":7,"token_type":"Bearer","issued_at_ms":1}"#,
        ] {
            #expect(refusal(try forged(plaintext)) == noToken, "\(plaintext)")
        }
        #expect(
            refusal(
                try forged(#"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":1,"scope":5}"#))
                == "holds a scope that is not text")
        for expiry in ["-5", "1.5", #""soon""#, "null", "1e300"] {
            #expect(
                refusal(
                    try forged(
                        #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":1,"expires_at_ms":\#(expiry)}"#
                    )) == "holds an expiry that is not a time", "expires_at_ms \(expiry)")
        }
        // The same hand-made bytes, with good fields, open: the refusals above are about the fields.
        let good = try forged(
            #"{"access_token":"\#(Self.secret)","token_type":"Bearer","issued_at_ms":1000,"expires_at_ms":2000,"extra":true}"#,
            version: 9)
        #expect(
            try Self.sealer().open(good, key: "orders").get()
                == StoredToken(
                    accessToken: Self.secret, tokenType: "Bearer", scope: nil, version: 9,
                    issuedAt: WallTime(timeIntervalSince1970: 1), expiresAt: WallTime(timeIntervalSince1970: 2)))
    }
}

/// The store's key file: 32 raw bytes or 64 hexadecimal digits, and nothing else.
@Suite struct StoreKeyFileTests {
    private static let raw = (0..<32).map { UInt8(255 - $0 * 5) }
    private static let hex = raw.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()

    /// Whether `cipher` is the cipher of `key`: what one seals, the other opens.
    private func isCipher(_ cipher: AESGCM, of key: [UInt8]) throws -> Bool {
        let sealed = try cipher.seal(Array("probe".utf8), associatedData: [])
        return AESGCM(key: key)?.open(sealed, associatedData: []) == Array("probe".utf8)
    }

    private func write(_ bytes: [UInt8], in folder: TemporaryDirectory) throws -> String {
        let path = folder.path("store.key")
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    @Test func thirtyTwoRawBytesAreTheKey() throws {
        let folder = try TemporaryDirectory()
        let cipher = try StoreKeyFile.read(try write(Self.raw, in: folder)).get()
        #expect(try isCipher(cipher, of: Self.raw))
        // Thirty-two bytes are raw even when they all are hexadecimal digits.
        let digits = Array(String(Self.hex.prefix(32)).utf8)
        #expect(try isCipher(try #require(StoreKeyFile.key(from: digits)), of: digits))
    }

    @Test(arguments: ["", "\n", "\r\n"])
    func sixtyFourHexadecimalDigitsAreTheKey(ending: String) throws {
        let folder = try TemporaryDirectory()
        for text in [Self.hex, Self.hex.uppercased()] {
            let cipher = try StoreKeyFile.read(try write(Array((text + ending).utf8), in: folder)).get()
            #expect(try isCipher(cipher, of: Self.raw), "\(text)\(ending.debugDescription)")
        }
    }

    @Test func keysWrittenByTheOpenSSLCommandLineAreRead() throws {
        let folder = try TemporaryDirectory()
        let rawPath = folder.path("raw.key")
        let hexPath = folder.path("hex.key")
        try OpenSSL.run(["rand", "-out", rawPath, "32"])
        try OpenSSL.run(["rand", "-hex", "-out", hexPath, "32"])
        let rawKey = Array(try Data(contentsOf: URL(fileURLWithPath: rawPath)))
        #expect(rawKey.count == 32)
        #expect(try isCipher(try StoreKeyFile.read(rawPath).get(), of: rawKey))
        let hexText = try String(contentsOfFile: hexPath, encoding: .utf8)
        #expect(hexText.hasSuffix("\n"))
        let hexKey = try #require(AESGCMKeyText.bytes(hexText.trimmingCharacters(in: .newlines)))
        #expect(try isCipher(try StoreKeyFile.read(hexPath).get(), of: hexKey))
    }

    @Test func otherContentsAreRefusedWithoutQuotingThem() throws {
        let folder = try TemporaryDirectory()
        let refused: [(String, [UInt8])] = [
            ("empty", []),
            ("31 raw bytes", Array(Self.raw.dropLast())),
            ("33 raw bytes", Self.raw + [0]),
            ("32 raw bytes and a newline", Self.raw + [10]),
            ("63 digits", Array(Self.hex.dropLast().utf8)),
            ("65 digits", Array((Self.hex + "0").utf8)),
            ("63 digits and a newline", Array((Self.hex.dropLast() + "\n").utf8)),
            ("64 digits and two newlines", Array((Self.hex + "\n\n").utf8)),
            ("64 digits and a space", Array((Self.hex + " ").utf8)),
            ("a space inside", Array((" " + Self.hex.dropFirst()).utf8)),
            ("a non-hex digit", Array(("g" + Self.hex.dropFirst()).utf8)),
            ("0x", Array(("0x" + Self.hex.dropFirst(2)).utf8)),
            ("base64", Array("q83vASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4k=".utf8)),
            ("a longer file", [UInt8](repeating: 0x41, count: 2000)),
        ]
        for (name, bytes) in refused {
            #expect(StoreKeyFile.key(from: bytes) == nil, "\(name)")
            let path = try write(bytes, in: folder)
            switch StoreKeyFile.read(path) {
            case .success:
                Issue.record("\(name) should be refused")
            case .failure(let problem):
                #expect(problem.description.contains(path), "\(name): the reason names the file")
                #expect(
                    !problem.description.contains(String(Self.hex.prefix(16))), "\(name): the reason quotes the key")
                if bytes.count <= 1024 {
                    #expect(
                        problem.description
                            == "\(path) holds no key; allowed: 32 bytes, or 64 hexadecimal digits (openssl rand -hex 32)",
                        "\(name)")
                }
            }
        }
    }

    @Test func aMissingFileIsRefusedWithTheSystemsReason() throws {
        let folder = try TemporaryDirectory()
        let path = folder.path("absent.key")
        guard case .failure(let problem) = StoreKeyFile.read(path) else {
            Issue.record("a missing key file should be refused")
            return
        }
        #expect(problem.description.hasPrefix("cannot read \(path): "))
    }
}

/// Hexadecimal text to bytes, for the keys `openssl rand -hex` writes.
private enum AESGCMKeyText {
    static func bytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count.isMultiple(of: 2) else { return nil }
        return stride(from: 0, to: digits.count, by: 2).map {
            UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16) ?? 0
        }
    }
}
