import Glibc
import TokenBrokerCore

/// Opens the listening socket itself, so that a failure names the address and the reason
/// (`Address already in use`) instead of libmicrohttpd's bare failure.
enum ListeningSocket {
    /// - Parameter unixMode: the file mode a Unix socket gets; it never has a wider one, even briefly.
    static func open(_ address: ListenAddress, unixMode: UInt32 = 0o660) throws(HTTPServerError) -> Int32 {
        if let path = address.unixPath { return try openUnix(path, mode: unixMode, address: address) }
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure(address) }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        // Accepted sockets inherit it: a streamed answer's head and first piece of body go out in
        // separate writes, and Nagle would hold the second until the client's delayed ACK (40 ms).
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
        var result: Int32
        if address.isIPv6 {
            var storage = sockaddr_in6()
            storage.sin6_family = sa_family_t(AF_INET6)
            storage.sin6_port = address.port.bigEndian
            // An IPv6 listener must not also take IPv4 connections the address did not name.
            guard setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &yes, socklen_t(MemoryLayout<Int32>.size)) == 0
            else {
                let error = failure(address)
                Glibc.close(fd)
                throw error
            }
            guard inet_pton(AF_INET6, address.host, &storage.sin6_addr) == 1 else {
                Glibc.close(fd)
                throw HTTPServerError(address: address, reason: "not an IPv6 address")
            }
            result = bind(fd, to: &storage)
        } else {
            var storage = sockaddr_in()
            storage.sin_family = sa_family_t(AF_INET)
            storage.sin_port = address.port.bigEndian
            guard inet_pton(AF_INET, address.host, &storage.sin_addr) == 1 else {
                Glibc.close(fd)
                throw HTTPServerError(address: address, reason: "not an IPv4 address")
            }
            result = bind(fd, to: &storage)
        }
        guard result == 0, listen(fd, 4096) == 0 else {
            let error = failure(address)
            Glibc.close(fd)
            throw error
        }
        return fd
    }

    /// Binds `fd` to an IPv4 or IPv6 address structure; `bind`'s result.
    private static func bind<Address>(_ fd: Int32, to storage: inout Address) -> Int32 {
        withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.bind(fd, $0, socklen_t(MemoryLayout<Address>.size))
            }
        }
    }

    /// A Unix socket at `path`. A socket file left by a process that is gone is replaced; a live
    /// one, one that cannot be tried (such as another user's that the broker may not connect
    /// to), or a file that is not a socket, is refused.
    private static func openUnix(_ path: String, mode: UInt32, address: ListenAddress) throws(HTTPServerError) -> Int32
    {
        var status = stat()
        if lstat(path, &status) == 0 {
            guard status.st_mode & S_IFMT == S_IFSOCK else {
                throw HTTPServerError(address: address, reason: "the path exists and is not a socket")
            }
            // Only a refused connection shows that nobody listens there any more.
            let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard probe >= 0 else { throw failure(address) }
            let connected = withUnixAddress(path) { connect(probe, $0, $1) } == 0
            let code = errno
            Glibc.close(probe)
            guard !connected else {
                throw HTTPServerError(address: address, reason: "another process is listening on it")
            }
            guard code == ECONNREFUSED else {
                throw HTTPServerError(
                    address: address,
                    reason: "a socket is there and cannot be tried (\(String(cString: strerror(code)))): "
                        + "remove it if no process listens on it")
            }
            unlink(path)
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure(address) }
        // The socket file is created with the umask's mode, so the umask gives it `mode`; no
        // `chmod` by path afterwards, which would follow a link put there in the meantime.
        let previous = umask(mode_t(0o777 & ~mode))
        let result = withUnixAddress(path) { Glibc.bind(fd, $0, $1) }
        umask(previous)
        guard result == 0, listen(fd, 4096) == 0 else {
            let error = failure(address)
            Glibc.close(fd)
            throw error
        }
        return fd
    }

    private static func withUnixAddress(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32
    {
        var storage = sockaddr_un()
        storage.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &storage.sun_path) { raw in
            for (index, byte) in bytes.prefix(raw.count - 1).enumerated() { raw[index] = byte }
        }
        return withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// The port the kernel gave the socket.
    static func boundPort(_ fd: Int32) -> UInt16 {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let ok = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard ok == 0 else { return 0 }
        let family = storage.ss_family
        return withUnsafePointer(to: &storage) { pointer in
            if family == sa_family_t(AF_INET6) {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    UInt16(bigEndian: $0.pointee.sin6_port)
                }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                UInt16(bigEndian: $0.pointee.sin_port)
            }
        }
    }

    private static func failure(_ address: ListenAddress) -> HTTPServerError {
        HTTPServerError(address: address, reason: String(cString: strerror(errno)))
    }
}
