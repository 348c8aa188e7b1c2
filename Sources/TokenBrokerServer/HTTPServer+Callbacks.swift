// libmicrohttpd's callbacks into `HTTPServer`: top-level closures that capture nothing and find
// the server through their context pointer (the server, unretained: it outlives its daemon).
internal import CMicroHTTPD
import Glibc

extension HTTPServer {
    /// The server a callback's context pointer stands for.
    static func fromOpaque(_ pointer: UnsafeMutableRawPointer) -> HTTPServer {
        Unmanaged<HTTPServer>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Calls `body` with the server `pointer` stands for, without a reference count: the
    /// callbacks every request runs use it (the server has a side table, where each count
    /// takes the slow path, some 60 instructions a retain and release).
    static func with<Result>(_ pointer: UnsafeMutableRawPointer, _ body: (HTTPServer) -> Result) -> Result {
        Unmanaged<HTTPServer>.fromOpaque(pointer)._withUnsafeGuaranteedRef(body)
    }
}

let accessHandlerCallback: MHD_AccessHandlerCallback = {
    cls, connection, url, method, version, uploadData, uploadSize, requestContext in
    guard let cls, let connection, let url, let method, let version, let uploadSize, let requestContext else {
        return CMicroHTTPD_no()
    }
    return HTTPServer.with(cls) {
        $0.access(
            connection, url: url, method: method, version: version, uploadData: uploadData, uploadSize: uploadSize,
            requestContext: requestContext)
    }
}

let requestCompletedCallback: MHD_RequestCompletedCallback = { cls, connection, requestContext, _ in
    guard let cls, let requestContext else { return }
    HTTPServer.with(cls) { $0.completed(connection, requestContext) }
}

let requestTargetCallback: CMicroHTTPD_uri_callback = { cls, uri, connection in
    guard let cls, let connection else { return nil }
    return HTTPServer.with(cls) { $0.requestTarget(uri, connection) }
}

// The percent-decoding of the path and each query name and value: CMicroHTTPD_unescape's, after
// the server has looked at where the value lies.
let unescapeCallback: CMicroHTTPD_unescape_callback = { cls, connection, value in
    guard let value else { return 0 }
    if let cls, let connection { HTTPServer.with(cls) { $0.unescaping(value, connection) } }
    return CMicroHTTPD_unescape(nil, connection, value)
}

let libraryLogCallback: MHD_LogCallback = { cls, format, arguments in
    guard let cls, let format, let arguments, let log = HTTPServer.fromOpaque(cls).configuration.libraryLog else {
        return
    }
    var buffer = [CChar](repeating: 0, count: 512)
    _ = vsnprintf(&buffer, buffer.count, format, arguments)
    var message = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    while message.last == "\n" { message.removeLast() }
    log(message)
}

let connectionNotifyCallback: MHD_NotifyConnectionCallback = { cls, connection, socketContext, code in
    guard let cls, let connection, let socketContext else { return }
    // MHD_CONNECTION_NOTIFY_STARTED is 0; its Swift name differs across libmicrohttpd versions.
    HTTPServer.fromOpaque(cls).connectionChanged(connection, socketContext: socketContext, opened: code.rawValue == 0)
}
