/// One token file of `sinks`: each new token of a provider written to a file, for programs that
/// read their token from a file (Kubernetes-style consumers, the cloud SDKs' web-identity flows,
/// scripts), as Vault Agent's file sink does.
///
///     "sinks": [{"provider": "default", "path": "/run/token-broker/default.token",
///                "format": "token", "mode": "0600"}]
///
/// With `audience`, `scope` or `resource`, the sink names a child of a template (a provider with
/// `perRequest`), checked against the template's allow-lists; the sink then keeps that child alive.
public struct SinkConfiguration: Sendable, Equatable {
    /// What the file holds.
    public enum Format: String, Sendable, CaseIterable {
        /// The bare token, with no newline.
        case token
        /// The `/token` body (`access_token`, `expires_at`, `version`, …) without `expires_in`:
        /// a file cannot count down, so its reader reads `expires_at`.
        case json
    }

    /// The provider whose tokens are written; required. It must refresh in the background
    /// (`backgroundRefreshEnabled`), since a file needs a token kept fresh.
    public var provider: String
    /// The file; required. Resolved against the configuration file's directory like other paths,
    /// and unique across sinks (here by its text; at start, also through `..` and symbolic links,
    /// by the directory's device and inode and the file's name). Its directory must exist, be
    /// owned by the broker's user or root, and not be writable by others, nor may any directory
    /// above it be, unless sticky (checked at start, `SinkDirectory`); `trustDirectoryWriters`
    /// lifts the last two checks.
    public var path: String
    /// Default `token`; also `json`.
    public var format: Format
    /// The file's permission bits, as octal text; default "0600".
    ///
    /// Allowed: owner and group bits only, no execute bit, at least one read bit; that is from
    /// "0400" to "0660", such as "0600", "0640" (a reader in the broker's group) or "0440". A
    /// token file is a secret: a mode that lets every user of the machine read it (or replace
    /// it, or run it) is refused rather than warned about, since the broker creates the file and
    /// nothing outside it forces that mode (unlike a mounted secret); a reader of another user
    /// shares a group with the broker instead.
    public var mode: UInt32
    /// The audience of a template's child, as a request's `?audience=` names it; nil for none.
    public var audience: String?
    /// The scope of a template's child (space-separated), as a request's `?scope=` names it; nil for none.
    public var scope: String?
    /// The resource of a template's child (RFC 8707), as a request's `?resource=` names it; nil for none.
    public var resource: String?
    /// Whether other users may write the file's directory, and the directories above it, because
    /// every one of them is trusted: a Kubernetes `emptyDir` shared by the containers of one pod,
    /// which the kubelet makes with mode 0777 and nobody in a pod without root can narrow.
    /// Default false.
    ///
    /// Only the checks that others cannot write those directories (by their mode, or an ACL
    /// entry) are lifted, and a directory at the file's path, which any of them could make, is a
    /// warning rather than a refusal; every other check stays: their owners, the links on the
    /// way, no default ACL, no file the broker reads, and how each write is made
    /// (`AtomicFileWriter`). Whoever can write the directory can still replace or remove the file
    /// between two writes, which `/readyz` then reports until the broker writes it again, or put
    /// a directory at its path, which fails every write until it is removed. The broker logs a
    /// warning for each such sink at start, at `--check-config` and at each reload.
    public var trustDirectoryWriters: Bool

    /// The default `mode`.
    public static let defaultMode: UInt32 = 0o600

    public init(
        provider: String, path: String, format: Format = .token, mode: UInt32 = defaultMode,
        audience: String? = nil, scope: String? = nil, resource: String? = nil, trustDirectoryWriters: Bool = false
    ) {
        self.provider = provider
        self.path = path
        self.format = format
        self.mode = mode
        self.audience = audience
        self.scope = scope
        self.resource = resource
        self.trustDirectoryWriters = trustDirectoryWriters
    }

    /// Whether the sink names a value for a template's child.
    public var namesValues: Bool { audience != nil || scope != nil || resource != nil }

    /// The values of the child this sink writes, checked against `configuration` (its provider)
    /// as a request's would be: `.none` when it names none.
    public func requestValues(for configuration: ProviderConfiguration) -> Result<
        TokenRequestValues, RequestValueProblem
    > {
        TokenRequestValues.checked(audience: audience, scope: scope, resource: resource, for: configuration)
    }

    /// Whether `mode` is one a token file may have (see `mode`).
    public static func isAllowedMode(_ mode: UInt32) -> Bool {
        mode & ~UInt32(0o660) == 0 && mode & 0o440 != 0
    }
}

extension SinkConfiguration {
    init(reading value: JSONValue, path keyPath: String) throws(ConfigurationError) {
        var reader = try ObjectReader(value, path: keyPath)
        guard let provider = try reader.string("provider"), !provider.isEmpty else {
            throw ConfigurationError(key: reader.keyPath("provider"), "is required: the name of a provider")
        }
        guard let path = try reader.string("path") else {
            throw ConfigurationError(
                key: reader.keyPath("path"), "is required: the token file, such as /run/token-broker/default.token")
        }
        if let problem = Self.pathProblem(path) {
            throw ConfigurationError(key: reader.keyPath("path"), problem)
        }
        self.init(provider: provider, path: path)
        format = try reader.choice("format", default: Format.token)
        if let text = try reader.string("mode") {
            guard (3...4).contains(text.utf8.count), text.utf8.allSatisfy({ (0x30...0x37).contains($0) }),
                let mode = UInt32(text, radix: 8), Self.isAllowedMode(mode)
            else {
                throw ConfigurationError(
                    key: reader.keyPath("mode"),
                    "\"\(text)\" is not a token file's mode; allowed: octal text from \"0400\" to \"0660\" with "
                        + "owner and group bits only and no execute bit, such as \"0600\", \"0640\" or \"0440\"")
            }
            self.mode = mode
        }
        audience = try reader.string("audience")
        scope = try reader.string("scope")
        resource = try reader.string("resource")
        trustDirectoryWriters = try reader.bool("trustDirectoryWriters", default: false)
        try reader.finish()
    }

    /// Why `path` cannot name a token file, or nil: it must name a file (not end in `/`, `.` or
    /// `..`) and hold no NUL, which the system calls would cut it at.
    static func pathProblem(_ path: String) -> String? {
        guard !path.isEmpty, !path.utf8.contains(0) else {
            return "must be a file path, without NUL characters"
        }
        let name = path.split(separator: "/", omittingEmptySubsequences: false).last ?? ""
        guard !name.isEmpty, name != ".", name != ".." else {
            return
                "\(JSONText.quoted(path)) names a directory; allowed: a file path, such as /run/token-broker/default.token"
        }
        return nil
    }

    /// The path with empty and `.` segments dropped, so that `a//b` and `./a/b` are found to be
    /// `a/b` when sinks are compared. Paths that meet through `..` or symbolic links are found
    /// at start, where the directories are opened (the file system, not the text, says).
    var comparablePath: String {
        let segments = path.split(separator: "/").filter { $0 != "." }
        return (path.hasPrefix("/") ? "/" : "") + segments.joined(separator: "/")
    }
}
