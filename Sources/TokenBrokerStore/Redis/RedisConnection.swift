internal import CHiredis
import Glibc
import TokenBrokerCore

/// One connection to Redis through hiredis's blocking API, with every call bounded by a timeout.
///
/// Not thread-safe: each belongs to one thread of the store (`RedisTokenStore`), and nothing else
/// calls it. A failed call (the connection cut, a timeout, a reply hiredis could not read) leaves
/// the connection unusable: `RedisFailure` says why, and the owner drops it and connects anew.
/// An error reply from Redis (`-ERR …`) is not a failure of the connection: it is `.error`.
final class RedisConnection {
    /// A reply, copied out of hiredis's reply tree (which is freed at once).
    enum Reply: Equatable {
        case string([UInt8])
        case integer(Int64)
        case array([Reply])
        case null
        case status(String)
        case error(String)
    }

    private let context: UnsafeMutablePointer<redisContext>

    private init(context: UnsafeMutablePointer<redisContext>) { self.context = context }

    deinit { redisFree(context) }

    /// Connects to `address` within `timeout`, then authenticates and selects the database.
    static func connect(_ settings: RedisStoreSettings, password: String?) throws(RedisFailure) -> RedisConnection {
        let timeout = timeval(milliseconds: settings.timeoutMsec)
        let made: UnsafeMutablePointer<redisContext>? =
            switch settings.address {
            case .tcp(let host, let port): redisConnectWithTimeout(host, Int32(port), timeout)
            case .unix(let path): redisConnectUnixWithTimeout(path, timeout)
            }
        guard let made else { throw RedisFailure("cannot connect to \(settings.address): out of memory") }
        let connection = RedisConnection(context: made)
        guard made.pointee.err == 0 else {
            throw RedisFailure("cannot connect to \(settings.address): \(connection.errorText)")
        }
        guard redisSetTimeout(made, timeout) == REDIS_OK else {
            throw RedisFailure("cannot set the timeout on \(settings.address): \(connection.errorText)")
        }
        if let password {
            var arguments = [Array("AUTH".utf8)]
            if let username = settings.username { arguments.append(Array(username.utf8)) }
            arguments.append(Array(password.utf8))
            // The reply is checked, never quoted: an error text might echo what was sent.
            if case .error = try connection.command(arguments) {
                throw RedisFailure("Redis at \(settings.address) refused the credentials (AUTH)")
            }
        }
        if settings.database != 0 {
            if case .error(let text) = try connection.command([
                Array("SELECT".utf8), Array(String(settings.database).utf8),
            ]) {
                throw RedisFailure("Redis at \(settings.address) refused SELECT \(settings.database): \(text)")
            }
        }
        return connection
    }

    /// The socket, for `poll` (the subscriber waits on it).
    var fileDescriptor: Int32 { context.pointee.fd }

    /// Sends a command and waits for its reply.
    func command(_ arguments: [[UInt8]]) throws(RedisFailure) -> Reply {
        let raw = try withArgv(arguments) { count, pointers, lengths in
            redisCommandArgv(context, count, pointers, lengths)
        }
        guard let raw else { throw RedisFailure(errorText) }
        defer { freeReplyObject(raw) }
        return Self.copy(raw.assumingMemoryBound(to: redisReply.self))
    }

    /// Sends a command without waiting for a reply (`SUBSCRIBE`, whose replies come as messages).
    func send(_ arguments: [[UInt8]]) throws(RedisFailure) {
        let status = try withArgv(arguments) { count, pointers, lengths in
            redisAppendCommandArgv(context, count, pointers, lengths)
        }
        guard status == REDIS_OK else { throw RedisFailure(errorText) }
        var done: Int32 = 0
        while done == 0 {
            guard redisBufferWrite(context, &done) == REDIS_OK else { throw RedisFailure(errorText) }
        }
    }

    /// Calls `body` with the arguments as hiredis reads them: a count, then each argument by
    /// pointer and length, all into one buffer that lives for the call.
    private func withArgv<T>(
        _ arguments: [[UInt8]],
        _ body: (Int32, UnsafeMutablePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int>?) -> T
    ) throws(RedisFailure) -> T {
        guard let count = Int32(exactly: arguments.count), count > 0 else { throw RedisFailure("an empty command") }
        var joined: [UInt8] = []
        var offsets: [Int] = []
        for argument in arguments {
            offsets.append(joined.count)
            joined += argument
        }
        // One byte more, so that the buffer has an address even when every argument is empty.
        joined.append(0)
        let lengths = arguments.map(\.count)
        return joined.withUnsafeBufferPointer { buffer in
            let base = UnsafeRawPointer(buffer.baseAddress!)
            var pointers: [UnsafePointer<CChar>?] = offsets.map {
                base.advanced(by: $0).assumingMemoryBound(to: CChar.self)
            }
            return pointers.withUnsafeMutableBufferPointer { pointers in
                lengths.withUnsafeBufferPointer { lengths in body(count, pointers.baseAddress, lengths.baseAddress) }
            }
        }
    }

    /// The next reply already read, or nil when none is complete: never waits.
    func bufferedReply() throws(RedisFailure) -> Reply? {
        var raw: UnsafeMutableRawPointer?
        guard redisGetReplyFromReader(context, &raw) == REDIS_OK else { throw RedisFailure(errorText) }
        guard let raw else { return nil }
        defer { freeReplyObject(raw) }
        return Self.copy(raw.assumingMemoryBound(to: redisReply.self))
    }

    /// Waits up to `milliseconds` for bytes from Redis, and reads what came; false when nothing did.
    func read(waitingAtMost milliseconds: Int32) throws(RedisFailure) -> Bool {
        var descriptor = pollfd(fd: context.pointee.fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&descriptor, 1, milliseconds)
        if ready < 0 {
            if errno == EINTR { return false }
            throw RedisFailure("poll failed: \(String(cString: strerror(errno)))")
        }
        guard ready > 0 else { return false }
        guard redisBufferRead(context) == REDIS_OK else { throw RedisFailure(errorText) }
        return true
    }

    /// hiredis's description of the connection's error.
    private var errorText: String {
        let text = withUnsafeBytes(of: context.pointee.errstr) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
        return text.isEmpty ? "the connection failed" : text
    }

    private static func copy(_ reply: UnsafeMutablePointer<redisReply>) -> Reply {
        let value = reply.pointee
        switch value.type {
        case REDIS_REPLY_STRING:
            return .string(bytes(value.str, value.len))
        case REDIS_REPLY_STATUS:
            return .status(String(decoding: bytes(value.str, value.len), as: UTF8.self))
        case REDIS_REPLY_ERROR:
            return .error(String(decoding: bytes(value.str, value.len), as: UTF8.self))
        case REDIS_REPLY_INTEGER:
            return .integer(value.integer)
        case REDIS_REPLY_ARRAY:
            var elements: [Reply] = []
            for index in 0..<value.elements {
                if let element = value.element?[index] { elements.append(copy(element)) }
            }
            return .array(elements)
        default:
            return .null
        }
    }

    private static func bytes(_ pointer: UnsafeMutablePointer<CChar>?, _ length: Int) -> [UInt8] {
        guard let pointer, length > 0 else { return [] }
        return Array(UnsafeRawBufferPointer(start: pointer, count: length))
    }
}

/// Why a call to Redis failed: the connection is then dropped. The text never holds a password.
struct RedisFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension timeval {
    init(milliseconds: Int) {
        self.init(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
    }
}
