import Glibc

/// A point in wall-clock time: seconds since 1970-01-01T00:00:00Z.
///
/// The broker's own, with the names of Foundation's `Date`, so that it needs no Foundation.
/// Timing decisions never use it (they run on an injected `Clock`); it only dates tokens:
/// `issued_at`, `expires_at`, a JWT's `iat` and `exp`.
public struct WallTime: Sendable, Equatable, Hashable, Comparable {
    public var timeIntervalSince1970: Double

    public init(timeIntervalSince1970: Double) { self.timeIntervalSince1970 = timeIntervalSince1970 }

    /// Now, by the system's real-time clock.
    public init() {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        timeIntervalSince1970 = Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    public func addingTimeInterval(_ seconds: Double) -> WallTime {
        WallTime(timeIntervalSince1970: timeIntervalSince1970 + seconds)
    }

    public func timeIntervalSince(_ other: WallTime) -> Double { timeIntervalSince1970 - other.timeIntervalSince1970 }

    public static func < (a: WallTime, b: WallTime) -> Bool { a.timeIntervalSince1970 < b.timeIntervalSince1970 }
}
