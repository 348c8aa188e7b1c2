/// OAuth 2.0's `token_type`: which names are accepted, and how they are served.
///
/// An issuer's `token_type` must be an RFC 6749 type name (Appendix A.13):
///
///     type-name = 1*name-char
///     name-char = "-" / "." / "_" / DIGIT / ALPHA
///
/// of at most 64 characters. Clients put it in front of the token in `Authorization`, so
/// anything else (a line break, NUL, a space, non-ASCII) is refused as a bad answer. The
/// grammar's other branch, an absolute URI for vendor types, is refused too: it cannot be an
/// HTTP authentication scheme.
///
/// Names compare case-insensitively (RFC 6749 §5.1), so the broker serves one spelling:
/// a registered name as the IANA registry writes it (`bearer` and `BEARER` become `Bearer`;
/// also `DPoP`, `N_A`, `PoP`), any other name in lower case.
public enum TokenType {
    /// The longest name accepted.
    public static let maximumLength = 64

    /// Names of the IANA "OAuth Access Token Types" registry, in their registered spelling.
    static let registered = ["Bearer", "DPoP", "N_A", "PoP"]

    /// The served spelling of `name`, or nil when it is not a type name.
    public static func normalised(_ name: String) -> String? {
        guard (1...maximumLength).contains(name.utf8.count), name.utf8.allSatisfy(isNameCharacter) else { return nil }
        let lower = name.lowercased()
        return registered.first { $0.lowercased() == lower } ?? lower
    }

    private static func isNameCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"):
            true
        default:
            false
        }
    }
}
