internal import CSystem

/// How the C allocator is set up for a server whose memory comes in bursts of waiters.
enum AllocatorTuning {
    /// Limits glibc's malloc to `arenas` arenas (`M_ARENA_MAX`).
    ///
    /// By default glibc gives each thread that allocates its own arena, up to eight per core.
    /// A burst of ten thousand waiters is allocated on one thread and freed on others, and each
    /// arena then keeps its own freed pages: measured with `make bench`, RSS after three bursts
    /// stood about a fifth above its level after the first, with two arenas still up to +18 %,
    /// with one +1 %. The request path allocates almost nothing, so one arena costs no
    /// measurable throughput (same `make bench`).
    ///
    /// - Important: call it first thing in `main`, before any thread starts.
    static func limitArenas(_ arenas: Int32) {
        _ = mallopt(M_ARENA_MAX, arenas)
    }
}
