internal import CSystem
import Glibc

/// How the C allocator is set up for a server whose memory comes in bursts of waiters.
enum AllocatorTuning {
    /// Limits glibc's malloc to `arenas` arenas (`M_ARENA_MAX`), unless the environment sets
    /// glibc's own limit (`MALLOC_ARENA_MAX`, or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`),
    /// which glibc has applied already: the operator's choice stands.
    ///
    /// By default glibc gives each thread that allocates its own arena, up to eight per core.
    /// A burst of ten thousand waiters is allocated on one thread and freed on others, and each
    /// arena then keeps its own freed pages: measured with `make bench`, RSS after three bursts
    /// stood about a fifth above its level after the first, with two arenas still up to +18 %,
    /// with one +1 %. The token routes allocate almost nothing, so one arena costs them no
    /// measurable throughput (same `make bench`).
    ///
    /// Proxied requests do allocate, on a server thread and on a libcurl loop's, and free on the
    /// other; with one arena the threads wait for its lock. glibc's default gave proxy mode 1.18
    /// times the req/s (BENCHMARKS.md, issue 19, third session), which is why an operator may
    /// want `MALLOC_ARENA_MAX=8` for a broker that mostly proxies (README, Operating it).
    ///
    /// - Important: call it first thing in `main`, before any thread starts.
    static func limitArenas(_ arenas: Int32) {
        if getenv("MALLOC_ARENA_MAX") != nil { return }
        if let tunables = getenv("GLIBC_TUNABLES"),
            String(cString: tunables).split(separator: ":").contains(where: { $0.hasPrefix("glibc.malloc.arena_max=") })
        {
            return
        }
        _ = mallopt(M_ARENA_MAX, arenas)
    }
}
