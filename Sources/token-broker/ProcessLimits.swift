import Glibc

/// Raises the open-file limit to what the system allows: each waiting long-poll is a socket,
/// and the usual soft limit of 1024 would cap the broker far below its connection limit.
enum ProcessLimits {
    /// Returns the soft limit in force afterwards.
    @discardableResult
    static func raiseOpenFileLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return UInt64(limit.rlim_cur)
    }
}

/// Secret files that others can read. Kubernetes mounts secrets 0644 by default, so the broker
/// warns instead of refusing to start.
enum SecretFilePermissions {
    /// Each configured secret file whose mode lets group or others read it, with that mode.
    static func exposed(_ paths: [String]) -> [(path: String, mode: String)] {
        var seen: Set<String> = []
        return paths.compactMap { path in
            guard seen.insert(path).inserted else { return nil }
            var info = stat()
            guard stat(path, &info) == 0, info.st_mode & 0o044 != 0 else { return nil }
            return (path, "0" + String(info.st_mode & 0o777, radix: 8))
        }
    }
}
