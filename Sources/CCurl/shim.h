// The parts of libcurl (Debian: libcurl4-openssl-dev, 7.88) that Swift cannot call directly.
// Every wrapper says why it exists. Everything else is called straight from Swift.
#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H

#include <curl/curl.h>

// curl_easy_setopt is variadic; one typed wrapper per kind of argument.
static inline CURLcode CCurl_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

// curl_easy_setopt is variadic; libcurl copies strings, so the pointer need not outlive the call.
static inline CURLcode CCurl_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}

// curl_easy_setopt is variadic; for CURLOPT_WRITEDATA, CURLOPT_HTTPHEADER and other pointers.
static inline CURLcode CCurl_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}

// curl_easy_setopt is variadic, and a blob option takes a struct curl_blob, made here:
// CURL_BLOB_COPY, so libcurl keeps a copy of its own and the bytes need not outlive the call.
static inline CURLcode CCurl_setopt_blob(CURL *handle, CURLoption option, const void *data, size_t length) {
    struct curl_blob blob = {(void *)data, length, CURL_BLOB_COPY};
    return curl_easy_setopt(handle, option, &blob);
}

// curl_easy_setopt is variadic, and a Swift function pointer must be passed as the callback type itself.
static inline CURLcode CCurl_setopt_write_function(CURL *handle, curl_write_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, callback);
}

// curl_easy_setopt is variadic; the header callback has the write callback's signature.
static inline CURLcode CCurl_setopt_header_function(CURL *handle, curl_write_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, callback);
}

// curl_easy_setopt is variadic; the read callback for uploads whose body arrives as it goes.
static inline CURLcode CCurl_setopt_read_function(CURL *handle, curl_read_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_READFUNCTION, callback);
}

// curl_multi_setopt is variadic; for long options such as CURLMOPT_MAXCONNECTS.
static inline CURLMcode CCurl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

// curl_easy_getinfo is variadic; this reads a curl_off_t item such as CURLINFO_CONTENT_LENGTH_DOWNLOAD_T.
static inline CURLcode CCurl_getinfo_offset(CURL *handle, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(handle, info, value);
}

// CURLMsg keeps the transfer's result in a union; Swift reads it more plainly through this.
static inline CURLcode CCurl_message_result(const CURLMsg *message) { return message->data.result; }

// curl_easy_getinfo is variadic; this reads a long-valued item such as CURLINFO_RESPONSE_CODE.
static inline CURLcode CCurl_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}

#endif
