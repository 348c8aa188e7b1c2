import Glibc

/// A POSIX thread running one closure: for loops that block in system calls (epoll, libcurl,
/// libmicrohttpd), which must never run on Swift's cooperative pool.
public enum SystemThread {
    /// Starts a thread running `body`, its identifier stored in `thread`; `pthread_create`'s
    /// error code, or 0. Whatever `body` captures is held until it returns.
    public static func start(_ thread: inout pthread_t, _ body: @escaping @Sendable () -> Void) -> Int32 {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        let status = pthread_create(
            &thread, nil,
            { context in
                Unmanaged<Body>.fromOpaque(context!).takeRetainedValue().run()
                return nil
            }, context)
        if status != 0 { Unmanaged<Body>.fromOpaque(context).release() }
        return status
    }

    private final class Body: Sendable {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
}
