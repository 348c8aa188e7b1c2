internal import CCurl
import TokenBrokerCore

/// One blocking HTTP request through libcurl (OpenSSL flavour).
///
/// - Important: blocks the calling thread for up to `timeout`. Never call it from a server
///   thread; the command-line health check is its place.
public enum CurlRequest {
    public struct Response: Sendable {
        public var status: Int
        public var body: [UInt8]
    }

    /// GETs `url`, following no redirects, reading at most `maximumBytes` of body.
    public static func get(_ url: String, timeoutMilliseconds: Int, maximumBytes: Int = 1 << 20) throws(TokenFetchError) -> Response {
        _ = globalInit
        guard let handle = curl_easy_init() else { throw .internalError("curl_easy_init failed") }
        defer { curl_easy_cleanup(handle) }
        let sink = BodySink(limit: maximumBytes)
        let sinkPointer = Unmanaged.passUnretained(sink).toOpaque()
        var code = CCurl_setopt_string(handle, CURLOPT_URL, url)
        code = code == CURLE_OK ? CCurl_setopt_long(handle, CURLOPT_TIMEOUT_MS, timeoutMilliseconds) : code
        code = code == CURLE_OK ? CCurl_setopt_long(handle, CURLOPT_NOSIGNAL, 1) : code
        code = code == CURLE_OK ? CCurl_setopt_long(handle, CURLOPT_FOLLOWLOCATION, 0) : code
        code = code == CURLE_OK ? CCurl_setopt_write_function(handle, writeCallback) : code
        code = code == CURLE_OK ? CCurl_setopt_pointer(handle, CURLOPT_WRITEDATA, sinkPointer) : code
        guard code == CURLE_OK else { throw .internalError("curl setup failed: \(String(cString: curl_easy_strerror(code)))") }
        let result = curl_easy_perform(handle)
        guard result == CURLE_OK else {
            let reason = String(cString: curl_easy_strerror(result))
            if result == CURLE_OPERATION_TIMEDOUT { throw .timeout(reason) }
            throw .unreachable(reason)
        }
        var status = 0
        _ = CCurl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
        return Response(status: status, body: sink.bytes)
    }

    private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

    private final class BodySink {
        var bytes: [UInt8] = []
        let limit: Int
        init(limit: Int) { self.limit = limit }
    }

    /// Appends a chunk; returning less than its size makes libcurl stop (body over the cap).
    private static let writeCallback: curl_write_callback = { data, size, count, context in
        guard let data, let context else { return 0 }
        let sink = Unmanaged<BodySink>.fromOpaque(context).takeUnretainedValue()
        let length = size * count
        guard sink.bytes.count + length <= sink.limit else { return 0 }
        data.withMemoryRebound(to: UInt8.self, capacity: length) { sink.bytes.append(contentsOf: UnsafeBufferPointer(start: $0, count: length)) }
        return length
    }
}
