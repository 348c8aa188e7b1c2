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

    /// File descriptors kept aside for everything but connections: the log, configuration, key,
    /// token and store files, Redis, each daemon's epoll and wake-up descriptors, the watchers.
    static let reservedFiles = 128
    /// The admin listener's connection limit: always served, so that a health check gets in
    /// however many token connections there are.
    static let adminConnections = 256
    /// The least connection limit a listener is given, whatever the open-file limit.
    static let leastConnectionLimit = 16

    /// The connection limit each token-route listener (the token listener, each cloud SDK
    /// protocol's own) can have within `openFiles` descriptors: `configured`, or less when the
    /// descriptors would run out first. Once they do, libmicrohttpd fails to take every new
    /// connection on every listener, the admin listener's too, and retries at once, so that
    /// it spins and no health check gets in; a limit that fits keeps a listener from taking
    /// more than there are.
    ///
    /// - Parameters:
    ///   - perConnection: the descriptors each connection of each such listener may hold, summed
    ///     over the listeners: 2 for a token listener that proxies (its upstream's too), 1 for
    ///     one that does not, 1 for each protocol listener of its own.
    ///   - upstream: descriptors libcurl may keep open besides those, in its connection caches.
    static func fittedConnectionLimit(configured: Int, openFiles: UInt64, perConnection: Int, upstream: Int) -> Int {
        let spare = Int(clamping: openFiles) - reservedFiles - adminConnections - upstream
        let fitting = spare / max(1, perConnection)
        return min(configured, max(leastConnectionLimit, fitting))
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
