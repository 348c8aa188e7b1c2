import Foundation
import Testing
import TokenBrokerCore
import TokenBrokerSources
import TokenBrokerTestSupport

@Suite struct FileTokenSourceTests {
    private func source(_ contents: String?, lifetimeSec: Int? = nil) throws -> (FileTokenSource, TemporaryDirectory) {
        let directory = try TemporaryDirectory()
        if let contents { try Data(contents.utf8).write(to: URL(fileURLWithPath: directory.path("token"))) }
        return (
            FileTokenSource(
                configuration: FileSourceConfiguration(path: directory.path("token"), lifetimeSec: lifetimeSec)),
            directory
        )
    }

    @Test func aJWTsExpiryComesFromItsExpClaim() throws {
        // Signed by the local signer, so the token is a real JWT with exp = iat + 600.
        let signer = try JWTSigner(configuration: JWTSourceConfiguration(lifetimeSec: 600))
        let issued = WallTime(timeIntervalSince1970: 1_800_000_000)
        let jwt = try signer.mint(now: issued).accessToken
        let (file, directory) = try source(jwt + "\n", lifetimeSec: 5)
        let token = try file.read(now: issued.addingTimeInterval(100))
        #expect(token.accessToken == jwt)
        #expect(token.lifetime == .seconds(500), "exp wins over lifetimeSec")
        #expect(throws: TokenFetchError.self) { try file.read(now: issued.addingTimeInterval(600)) }
        _ = directory
    }

    @Test func anOpaqueTokenTakesLifetimeSecOrNoExpiry() throws {
        let (file, directory) = try source("  opaque-value\n", lifetimeSec: 60)
        #expect(try file.read(now: WallTime()) == FetchedToken(accessToken: "opaque-value", lifetime: .seconds(60)))
        let (endless, other) = try source("opaque-value")
        #expect(try endless.read(now: WallTime()).lifetime == nil)
        _ = (directory, other)
    }

    /// White space in Unicode's sense around the token goes, as written by editors and `echo`;
    /// inside it, it makes two words.
    @Test func whiteSpaceAroundTheTokenIsTrimmedInUnicodesSense() throws {
        let (file, directory) = try source("\t\u{00A0}\u{2028} opaque-value\r\n\u{3000}\n")
        #expect(try file.read(now: WallTime()).accessToken == "opaque-value")
        let (split, other) = try source(" opaque\u{00A0}value \n")
        #expect { try split.read(now: WallTime()) } throws: {
            ($0 as? TokenFetchError)?.detail == "the token file holds more than one word"
        }
        _ = (directory, other)
    }

    @Test(arguments: [nil, "", "   \n", "two words"])
    func missingEmptyOrMalformedFilesAreClassifiedErrors(_ contents: String?) throws {
        let (file, directory) = try source(contents)
        #expect(throws: TokenFetchError.self) { try file.read(now: WallTime()) }
        _ = directory
    }
}
