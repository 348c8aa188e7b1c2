internal import CMicroHTTPD

/// How the C allocator is set up for a server whose memory comes in bursts of waiters.
public enum AllocatorTuning {
    /// Limits glibc's malloc to `arenas` arenas (`M_ARENA_MAX`).
    ///
    /// By default glibc gives each thread that allocates its own arena, up to eight per core.
    /// A burst of ten thousand waiters is allocated on one thread and freed on others, and each
    /// arena then keeps its own freed pages: measured with `make bench`, RSS after repeated
    /// bursts kept climbing by a fifth. Two arenas, one per core here, keep it flat.
    ///
    /// - Important: call it first thing in `main`, before any thread starts.
    public static func limitArenas(_ arenas: Int32) {
        _ = mallopt(M_ARENA_MAX, arenas)
    }
}
