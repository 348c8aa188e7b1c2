internal import CHiredis
import Glibc
import TokenBrokerCore

/// One connection to Redis through hiredis, with every call bounded by `timeoutMsec`.
///
/// hiredis's blocking calls bound each read and write of the socket (`redisSetTimeout`), not a
/// whole reply: a Redis that sends its answer a byte at a time, each byte within the timeout,
/// would hold a call for as long as it likes. So the connection sends and reads itself, through
/// hiredis's buffers, polling the socket with what is left of the call's `timeoutMsec`, and
/// gives up when nothing is. It also reads at most
/// `replyLimit` bytes towards one reply: a record is at most `StoreRecord.maximumSize`, and a
/// Redis that sends more (a huge bulk string) is not one the store can use. Its reader refuses,
/// at their head, replies no command of the store's gets back (`longestString`,
/// `mostElements`): hiredis makes an array's table of elements as soon as it reads its length,
/// so an array's 13-byte head once cost 16 GB of address space and seconds of CPU.
///
/// A host name is looked up within the call's deadline too (`RedisHostResolver`), and hiredis
/// connects to the numeric address.
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

    /// The most bytes read towards one reply: a record, the channel's framing of it, and room.
    static let replyLimit = StoreRecord.maximumSize + 64 * 1024
    /// The longest string any command of the store's gets back: a message on the channel (the
    /// record key's hash, 64 hex digits, the sender's id, 32, a mark, then the sealed record).
    /// `GETRANGE` answers at most a record and a byte; statuses and errors are short.
    static let longestString = 97 + StoreRecord.maximumSize
    /// The most elements of an array any command of the store's gets back: `SUBSCRIBE`'s
    /// confirmation and each message on the channel have three; the scripts answer integers. An
    /// array inside an array is refused too: no command of the store's gets one.
    static let mostElements = 3

    private let context: UnsafeMutablePointer<redisContext>
    /// The limits of what the reader builds; lives as long as `context`.
    private let bounds: UnsafeMutablePointer<CHiredis_ReplyBounds>
    /// How long one call may take.
    private let timeoutMsec: Int
    /// When the call under way must be over.
    private var deadline = ContinuousClock.now
    /// When set, the end of every call until it is cleared: one budget for several calls (the
    /// store's connecting, authenticating and first command share one `timeoutMsec`).
    var sharedDeadline: ContinuousClock.Instant?
    /// Bytes read since the last whole reply.
    private var replyBytes = 0

    private init(context: UnsafeMutablePointer<redisContext>, timeoutMsec: Int) {
        self.context = context
        self.timeoutMsec = timeoutMsec
        bounds = .allocate(capacity: 1)
        bounds.initialize(to: CHiredis_ReplyBounds())
        if context.pointee.reader != nil {
            CHiredis_boundReplies(context, bounds, Self.longestString, Int32(Self.mostElements))
        }
    }

    deinit {
        redisFree(context)
        bounds.deallocate()
    }

    /// Connects to `address`, then authenticates and selects the database, all by `deadline`
    /// (by default, within `timeoutMsec`).
    /// - Parameter resolver: looks up the host's name (the store's, shared by its connections, so
    ///   that a slow lookup is made once); nil: one of the connection's own.
    static func connect(
        _ settings: RedisStoreSettings, password: String?, deadline given: ContinuousClock.Instant? = nil,
        resolver: RedisHostResolver? = nil
    ) throws(RedisFailure) -> RedisConnection {
        let deadline = given ?? ContinuousClock.now.advanced(by: .milliseconds(settings.timeoutMsec))
        let connection = try open(settings, by: deadline, resolver: resolver)
        connection.sharedDeadline = deadline
        defer { connection.sharedDeadline = nil }
        let timeout = try timeval(milliseconds: Int(connection.millisecondsLeft()))
        // Each read and write is bounded too, though none is made before `poll` says it can go on.
        guard redisSetTimeout(connection.context, timeout) == REDIS_OK else {
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

    /// A connection to `settings.address` made by `deadline`: to each address of the host in
    /// turn, until one connects.
    private static func open(
        _ settings: RedisStoreSettings, by deadline: ContinuousClock.Instant, resolver given: RedisHostResolver?
    ) throws(RedisFailure) -> RedisConnection {
        switch settings.address {
        case .tcp(let host, let port):
            let resolver = given ?? RedisHostResolver(host: host)
            let addresses: [String]
            do {
                addresses = try resolver.addresses(by: deadline, timeoutMsec: settings.timeoutMsec)
            } catch {
                throw RedisFailure("cannot connect to \(settings.address): \(error)", timedOut: error.timedOut)
            }
            var last = RedisFailure("cannot connect to \(settings.address)")
            for address in addresses {
                do {
                    return try made(settings, by: deadline) { redisConnectWithTimeout(address, Int32(port), $0) }
                } catch {
                    last = error
                    if error.timedOut { break }
                }
            }
            resolver.forget()
            throw last
        case .unix(let path):
            return try made(settings, by: deadline) { redisConnectUnixWithTimeout(path, $0) }
        }
    }

    /// The connection `connecting` makes, given what is left until `deadline`.
    private static func made(
        _ settings: RedisStoreSettings, by deadline: ContinuousClock.Instant,
        _ connecting: (timeval) -> UnsafeMutablePointer<redisContext>?
    ) throws(RedisFailure) -> RedisConnection {
        let left = ContinuousClock.now.duration(to: deadline).wholeMilliseconds
        guard left > 0 else {
            throw RedisFailure("Redis did not answer within \(settings.timeoutMsec) ms", timedOut: true)
        }
        guard let made = connecting(timeval(milliseconds: Int(clamping: left))) else {
            throw RedisFailure("cannot connect to \(settings.address): out of memory")
        }
        let connection = RedisConnection(context: made, timeoutMsec: settings.timeoutMsec)
        guard made.pointee.err == 0 else {
            throw RedisFailure("cannot connect to \(settings.address): \(connection.errorText)")
        }
        return connection
    }

    /// The socket, for `poll` (the subscriber waits on it).
    var fileDescriptor: Int32 { context.pointee.fd }

    /// Sends a command and waits for its reply, within `timeoutMsec`.
    func command(_ arguments: [[UInt8]]) throws(RedisFailure) -> Reply {
        try send(arguments)
        while true {
            if let reply = try bufferedReply() { return reply }
            _ = try read(waitingAtMost: try millisecondsLeft())
        }
    }

    /// Sends a command without waiting for a reply (`SUBSCRIBE`, whose replies come as messages),
    /// within `timeoutMsec`; a `command` has what is left of that for its reply.
    func send(_ arguments: [[UInt8]]) throws(RedisFailure) {
        deadline = sharedDeadline ?? ContinuousClock.now.advanced(by: .milliseconds(timeoutMsec))
        let status = try withArgv(arguments) { count, pointers, lengths in
            redisAppendCommandArgv(context, count, pointers, lengths)
        }
        guard status == REDIS_OK else { throw RedisFailure(errorText) }
        var done: Int32 = 0
        while done == 0 {
            guard try wait(for: POLLOUT, milliseconds: try millisecondsLeft()) else { continue }
            guard redisBufferWrite(context, &done) == REDIS_OK else { throw RedisFailure(errorText) }
        }
    }

    /// Whole milliseconds left of the call under way (of `sharedDeadline`, when set); throws when
    /// less than one is.
    private func millisecondsLeft() throws(RedisFailure) -> Int32 {
        let left = ContinuousClock.now.duration(to: sharedDeadline ?? deadline).wholeMilliseconds
        guard left > 0 else { throw RedisFailure("Redis did not answer within \(timeoutMsec) ms", timedOut: true) }
        return Int32(clamping: left)
    }

    /// Waits up to `milliseconds` for the socket to be ready for `events`; false when it was not
    /// (or a signal came).
    private func wait(for events: Int32, milliseconds: Int32) throws(RedisFailure) -> Bool {
        var descriptor = pollfd(fd: context.pointee.fd, events: Int16(events), revents: 0)
        let ready = poll(&descriptor, 1, milliseconds)
        if ready < 0 {
            if errno == EINTR { return false }
            throw RedisFailure("poll failed: \(String(cString: strerror(errno)))")
        }
        return ready > 0
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
        guard redisGetReplyFromReader(context, &raw) == REDIS_OK else {
            throw RedisFailure(refusal ?? errorText)
        }
        guard let raw else { return nil }
        defer { freeReplyObject(raw) }
        replyBytes = 0
        return Self.copy(raw.assumingMemoryBound(to: redisReply.self))
    }

    /// Waits up to `milliseconds` for bytes from Redis, and reads what came; false when nothing
    /// did. Throws when the reply being read has grown past `replyLimit`.
    func read(waitingAtMost milliseconds: Int32) throws(RedisFailure) -> Bool {
        guard try wait(for: POLLIN, milliseconds: milliseconds) else { return false }
        let before = context.pointee.reader.pointee.len
        guard redisBufferRead(context) == REDIS_OK else { throw RedisFailure(errorText) }
        let after = context.pointee.reader.pointee.len
        replyBytes += after > before ? after - before : 0
        guard replyBytes <= Self.replyLimit else {
            throw RedisFailure("Redis sent more than \(Self.replyLimit) bytes for one reply")
        }
        return true
    }

    /// What the reader refused (hiredis says "Out of memory" whatever it was), or nil.
    private var refusal: String? {
        switch bounds.pointee.refused {
        case Int32(CHiredis_RefusedLongString):
            "Redis sent a string longer than \(Self.longestString) bytes, which no command of the store's gets back"
        case Int32(CHiredis_RefusedLongArray):
            "Redis sent an array of more than \(Self.mostElements) elements, which no command of the store's gets back"
        case Int32(CHiredis_RefusedNestedArray):
            "Redis sent an array inside an array, which no command of the store's gets back"
        default: nil
        }
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
    /// The call ran out of time (Redis, or the lookup of its name, did not answer in time, or
    /// the call waited too long for its turn): Redis is slow.
    let timedOut: Bool
    init(_ description: String, timedOut: Bool = false) {
        self.description = description
        self.timedOut = timedOut
    }
}

extension timeval {
    init(milliseconds: Int) {
        self.init(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
    }
}
