import Foundation
import Testing
import TokenBrokerCrypto
import TokenBrokerTestSupport

/// Hashes, MACs, random bytes, constant-time comparison and log fingerprints, each checked
/// against the `openssl` command line, an implementation independent of this code.
@Suite struct CryptoTests {
    private static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    /// The hex digest `openssl dgst` prints for a file holding `message`.
    private static func openssl(_ arguments: [String], message: [UInt8]) throws -> String {
        let folder = try TemporaryDirectory()
        let path = folder.path("message")
        try Data(message).write(to: URL(fileURLWithPath: path))
        let output = try OpenSSL.run(["dgst"] + arguments + ["-r", path])
        return String(output.prefix { $0 != " " })
    }

    @Test(arguments: [[], Array("token-broker".utf8), Array(repeating: 0xFF, count: 1000), [0, 10, 13]])
    func sha256MatchesOpenSSL(message: [UInt8]) throws {
        #expect(Self.hex(try Crypto.sha256(message)) == (try Self.openssl(["-sha256"], message: message)))
    }

    @Test func hmacSHA256MatchesOpenSSL() throws {
        let key = Array("a key that is not hex".utf8)
        let message = Array("header.payload".utf8)
        let expected = try Self.openssl(
            ["-sha256", "-mac", "HMAC", "-macopt", "hexkey:" + Self.hex(key)], message: message)
        #expect(Self.hex(try Crypto.hmacSHA256(key: key, message: message)) == expected)
    }

    @Test func randomBytesHaveTheLengthAskedAndDiffer() throws {
        let first = try Crypto.randomBytes(32)
        let second = try Crypto.randomBytes(32)
        #expect(first.count == 32 && second.count == 32)
        #expect(first != second, "two 256-bit draws collide with probability 2^-256")
        #expect(try Crypto.randomBytes(0).isEmpty)
    }

    @Test func constantTimeEqualComparesWholeStrings() {
        #expect(Crypto.constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!Crypto.constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!Crypto.constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(Crypto.constantTimeEqual([], []))
    }

    @Test func fingerprintIsTheFirstSixBytesOfSHA256AndNeverTheSecret() throws {
        let secret = "eyJhbGciOiJIUzI1NiJ9.secret.signature"
        let digest = try Self.openssl(["-sha256"], message: Array(secret.utf8))
        let fingerprint = Fingerprint.of(secret)
        #expect(fingerprint == "sha256:" + digest.prefix(12))
        #expect(!fingerprint.contains("secret"))
    }
}
