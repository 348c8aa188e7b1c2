import TokenBrokerCore
import TokenBrokerCrypto

/// A stored token as bytes, sealed with AES-256-GCM: the one format of every store's records.
///
///     bytes 0–7    "TBSTORE1"                      the format
///     bytes 8–15   the token's version             unsigned, big-endian
///     then         nonce (12) ‖ ciphertext ‖ tag (16)
///
/// The associated data is the first 16 bytes followed by the record's key (the provider's name,
/// and a template child's values, `StoreSlot.key`), in UTF-8: a record moved to another
/// provider's key, or given another version, fails to authenticate like a changed byte does.
///
/// The plaintext is a JSON object: `access_token`, `token_type`, `scope` (when the issuer said),
/// `issued_at_ms` and `expires_at_ms` (Unix time in milliseconds; no `expires_at_ms` for a token
/// without expiry), and `settings`, a digest of the provider's settings (`StoreSlot.settings`).
/// Nothing else is stored: no client secret, no key, no request.
public struct StoreRecord: Sendable {
    /// The format's first bytes.
    public static let magic = Array("TBSTORE1".utf8)
    /// The largest record read: a token is at most 64 KiB (the sources' limit), so this leaves room.
    public static let maximumSize = 256 * 1024
    /// The first version a record may not name: versions have at most 15 digits, the most the API
    /// reads back (`/token/ready`'s `after`, `/token/refresh`'s `rejected_version`). A provider's
    /// versions go on from a record's, by adding one, so a larger one (from a store written by
    /// something else) would make versions the API refuses, and near the end of `UInt64`, trap.
    public static let versionLimit: UInt64 = 1_000_000_000_000_000
    /// The latest time a record may name, 9999-12-31T23:59:59.999Z: room for any token, and
    /// far inside what a `Double` of seconds holds exactly.
    static let latestMilliseconds = 253_402_300_799_999

    private let cipher: AESGCM

    public init(cipher: AESGCM) { self.cipher = cipher }

    /// `record` sealed under `key`.
    /// - Throws: `internalError` when OpenSSL fails, or when the sealed record would be larger than
    ///   `maximumSize` (an issuer's huge scope, say): `open` would refuse it, so no store keeps it.
    public func seal(_ record: StoredToken, key: String) throws(TokenFetchError) -> [UInt8] {
        let header = Self.header(version: record.version)
        var members = [
            ("access_token", JSONText.quoted(record.accessToken)), ("token_type", JSONText.quoted(record.tokenType)),
        ]
        if let scope = record.scope { members.append(("scope", JSONText.quoted(scope))) }
        members.append(("issued_at_ms", String(Self.milliseconds(record.issuedAt))))
        if let expiresAt = record.expiresAt { members.append(("expires_at_ms", String(Self.milliseconds(expiresAt)))) }
        members.append(("settings", JSONText.quoted(record.settings)))
        let plaintext = Array(JSONText.object(members).utf8)
        let sealed = header + (try cipher.seal(plaintext, associatedData: header + Array(key.utf8)))
        guard sealed.count <= Self.maximumSize else {
            throw .internalError(
                "the record would be \(sealed.count) bytes, larger than \(Self.maximumSize) bytes, the most a store reads"
            )
        }
        return sealed
    }

    /// The record in `bytes`, kept under `key`, or why it may not be used. The reason never
    /// quotes the bytes.
    public func open(_ bytes: [UInt8], key: String) -> Result<StoredToken, StoreRecordProblem> {
        guard bytes.count <= Self.maximumSize else { return .failure(.init("is larger than any record")) }
        guard let version = Self.version(of: bytes) else {
            return .failure(.init("is not a token-broker store record (its first bytes are not TBSTORE1)"))
        }
        guard
            let plaintext = cipher.open(Array(bytes[16...]), associatedData: Array(bytes[..<16]) + Array(key.utf8))
        else {
            return .failure(
                .init("does not authenticate: sealed under another key, for another provider, or changed"))
        }
        guard version >= 1 else { return .failure(.init("names version 0")) }
        guard version < Self.versionLimit else { return .failure(.init("names a version of more than 15 digits")) }
        guard case .object(let members)? = try? JSONValue(parsing: plaintext),
            case .string(let accessToken)? = members["access_token"], !accessToken.isEmpty,
            case .string(let tokenType)? = members["token_type"], !tokenType.isEmpty,
            let issuedAt = members["issued_at_ms"].flatMap(Self.time)
        else { return .failure(.init("authenticates but does not hold a token (a newer format?)")) }
        var scope: String?
        if let value = members["scope"] {
            guard case .string(let text) = value else { return .failure(.init("holds a scope that is not text")) }
            scope = text
        }
        var settings = ""
        if let value = members["settings"] {
            guard case .string(let text) = value else { return .failure(.init("holds settings that are not text")) }
            settings = text
        }
        var expiresAt: WallTime?
        if let value = members["expires_at_ms"] {
            guard let time = Self.time(value) else { return .failure(.init("holds an expiry that is not a time")) }
            expiresAt = time
        }
        return .success(
            StoredToken(
                accessToken: accessToken, tokenType: tokenType, scope: scope, version: version, issuedAt: issuedAt,
                expiresAt: expiresAt, settings: settings))
    }

    /// The version in a record's header, read without opening it (it is in clear), or nil for
    /// bytes that are not a record.
    public static func version(of bytes: [UInt8]) -> UInt64? {
        guard bytes.count >= 16, bytes.starts(with: magic) else { return nil }
        return bytes[8..<16].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }

    /// The record's first 16 bytes: the format, then the version.
    static func header(version: UInt64) -> [UInt8] {
        magic + (0..<8).reversed().map { UInt8(truncatingIfNeeded: version >> (8 * UInt64($0))) }
    }

    /// A time as whole milliseconds since 1970, clamped to the range a record may hold.
    static func milliseconds(_ time: WallTime) -> Int {
        let value = (time.timeIntervalSince1970 * 1000).rounded()
        guard value.isFinite else { return 0 }
        return Int(min(max(value, 0), Double(latestMilliseconds)))
    }

    /// A record's time, checked: a whole number of milliseconds from 1970 to the year 9999.
    private static func time(_ value: JSONValue) -> WallTime? {
        guard let milliseconds = value.exactInt, (0...latestMilliseconds).contains(milliseconds) else { return nil }
        return WallTime(timeIntervalSince1970: Double(milliseconds) / 1000)
    }
}

/// Why a stored record may not be used, in words that never quote it.
public struct StoreRecordProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
