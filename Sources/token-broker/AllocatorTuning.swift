internal import CSystem
import Glibc
import TokenBrokerUpstream

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
    /// Proxied requests do allocate. With proxies configured, the token listener runs on the
    /// libcurl loops, and a proxied request is allocated and freed on its loop's thread; with one
    /// arena the loops wait for its lock. So such a broker gets one arena per loop besides the
    /// first (`arenas(proxying:)`): 1.13 times the req/s and 0.71 times the p99 on proxied small
    /// GETs with two loops (BENCHMARKS.md, issue 19, 2026-12-03).
    ///
    /// - Important: glibc fixes its arena limit when a thread other than the main one first
    ///   allocates: call it before any thread starts (first thing in `main`, and again in
    ///   `Broker.run` before anything starts a thread).
    static func limitArenas(_ arenas: Int32) {
        if getenv("MALLOC_ARENA_MAX") != nil { return }
        if let tunables = getenv("GLIBC_TUNABLES"),
            String(cString: tunables).split(separator: ":").contains(where: { $0.hasPrefix("glibc.malloc.arena_max=") })
        {
            return
        }
        _ = mallopt(M_ARENA_MAX, arenas)
    }

    /// The arenas for a broker with or without proxies: one, or one more per libcurl loop.
    static func arenas(proxying: Bool) -> Int32 {
        proxying ? Int32(1 + UpstreamHTTPClient.loopCount) : 1
    }
}
