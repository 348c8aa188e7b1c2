// The parts of libmicrohttpd (Debian: libmicrohttpd-dev, 0.9.7x) that Swift cannot call directly.
// Every wrapper says why it exists. Everything else is called straight from Swift.
#ifndef CMICROHTTPD_SHIM_H
#define CMICROHTTPD_SHIM_H

#include <limits.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <microhttpd.h>

// MHD_start_daemon is variadic; Swift cannot call it, so all options travel in one MHD_OPTION_ARRAY.
static inline struct MHD_Daemon *CMicroHTTPD_start_daemon(unsigned int flags,
                                                          MHD_AccessHandlerCallback handler,
                                                          void *handler_cls,
                                                          struct MHD_OptionItem *options) {
    return MHD_start_daemon(flags, 0, NULL, NULL, handler, handler_cls,
                            MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

// MHD_OptionItem keeps function pointers in a void *; a C cast is the only portable way to put one there.
static inline struct MHD_OptionItem CMicroHTTPD_option_notify_completed(MHD_RequestCompletedCallback callback, void *cls) {
    struct MHD_OptionItem item = { MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)callback, cls };
    return item;
}

// MHD_create_response_from_buffer's memory-mode enum is "fixed" in 0.9.7x and imports under
// different Swift names across versions; this always asks libmicrohttpd to copy the body.
static inline struct MHD_Response *CMicroHTTPD_response_copying(size_t size, const void *data) {
    return MHD_create_response_from_buffer(size, (void *)data, MHD_RESPMEM_MUST_COPY);
}

// MHD_set_response_options is variadic. This sets MHD_RF_HTTP_1_0_COMPATIBLE_STRICT (0.9.73+):
// the answer is sent without chunking, and the connection closed after it.
static inline int CMicroHTTPD_response_framed_by_close(struct MHD_Response *response) {
    return MHD_set_response_options(response, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END) == MHD_YES;
}

// MHD_get_connection_info is variadic; this asks it for the connection's socket, or -1.
static inline int CMicroHTTPD_connection_fd(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : info->connect_fd;
}

// Like the one above, for MHD_OPTION_NOTIFY_CONNECTION.
static inline struct MHD_OptionItem CMicroHTTPD_option_notify_connection(MHD_NotifyConnectionCallback callback, void *cls) {
    struct MHD_OptionItem item = { MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)callback, cls };
    return item;
}

// Like the one above, for MHD_OPTION_URI_LOG_CALLBACK, which sees the request target before
// libmicrohttpd percent-decodes it; its return value becomes the request's context.
typedef void *(*CMicroHTTPD_uri_callback)(void *cls, const char *uri, struct MHD_Connection *connection);
static inline struct MHD_OptionItem CMicroHTTPD_option_uri_log(CMicroHTTPD_uri_callback callback, void *cls) {
    struct MHD_OptionItem item = { MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)callback, cls };
    return item;
}

// Like the ones above, for MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's own messages, which can
// quote a request's path, go through the broker's log instead of straight to stderr.
// The length of a request target as the request-line callback gets it (up to its first NUL),
// or -1 when it holds a space, a tab or another control character, or DEL, none of which a
// target may hold (RFC 9112 §3.2, RFC 3986 §2). Three passes that glibc runs 16 bytes at a time
// (strcspn with a set of at most 16 bytes, strchr), where one set of all 33 bytes would have
// strcspn build a table of 256 first, at every request.
static inline long CMicroHTTPD_target_length(const char *uri) {
    static const char low[] = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10";
    static const char high[] = "\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x20";
    size_t length = strcspn(uri, low);
    if (uri[length] != '\0' || uri[strcspn(uri, high)] != '\0' || strchr(uri, 0x7f) != NULL) return -1;
    return (long)length;
}

static inline struct MHD_OptionItem CMicroHTTPD_option_logger(MHD_LogCallback callback, void *cls) {
    struct MHD_OptionItem item = { MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)callback, cls };
    return item;
}

// MHD_get_connection_info is variadic; this asks it for the size of the request head (request
// line and headers, as parsed in place), or 0 when it is not known.
static inline size_t CMicroHTTPD_request_header_size(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    return info == NULL ? 0 : info->header_size;
}

// MHD_get_connection_info is variadic; this asks it for the context set when the connection opened.
static inline void *CMicroHTTPD_socket_context(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == NULL ? NULL : info->socket_context;
}

// MHD_YES and MHD_NO are enum constants whose type changed across versions (int, then enum MHD_Result).
// MHD_get_daemon_info returns a union; the epoll descriptor of a daemon in external epoll mode,
// which the event loop running it polls; -1 if there is none.
static inline int CMicroHTTPD_daemon_epoll_fd(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_EPOLL_FD);
    return info == NULL ? -1 : info->epoll_fd;
}

// MHD_get_connection_info returns a union; the daemon that runs a connection.
static inline struct MHD_Daemon *CMicroHTTPD_connection_daemon(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_DAEMON);
    return info == NULL ? NULL : info->daemon;
}

// MHD_get_timeout reports through a pointer to an unsigned long long; the milliseconds until a
// daemon in external mode must run again, or -1 when it has nothing to time out (poll's "wait
// for ever").
static inline int CMicroHTTPD_wait_ms(struct MHD_Daemon *daemon) {
    MHD_UNSIGNED_LONG_LONG timeout = 0;
    if (MHD_get_timeout(daemon, &timeout) != MHD_YES) return -1;
    return timeout > (MHD_UNSIGNED_LONG_LONG)INT32_MAX ? INT32_MAX : (int)timeout;
}

// The same, capped at 1000 (also when the daemon has no timeout): for event loops that poll
// other things besides.
static inline int CMicroHTTPD_timeout_ms(struct MHD_Daemon *daemon) {
    int timeout = CMicroHTTPD_wait_ms(daemon);
    return timeout < 0 || timeout > 1000 ? 1000 : timeout;
}

// MHD_get_daemon_info is variadic; the connections a daemon in external mode holds, suspended
// ones and ones closed but not yet cleaned up included (libmicrohttpd cleans up first, so call
// it on the thread that runs the daemon); UINT_MAX if it does not say.
static inline unsigned int CMicroHTTPD_daemon_connections(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info == NULL ? UINT_MAX : info->num_connections;
}

// libmicrohttpd percent-decodes the path and each query name and value with MHD_http_unescape, a
// byte at a time, and the request's target is decoded in every request. This gives the same
// answer: everything before the first '%' decodes to itself (MHD_http_unescape only ever turns
// "%HH" into a byte), so strcspn skips that part at memory speed and MHD_http_unescape decodes
// the rest. Most targets have no '%' at all, and cost one scan.
static inline size_t CMicroHTTPD_unescape(void *cls, struct MHD_Connection *connection, char *value) {
    (void)cls;
    (void)connection;
    size_t plain = strcspn(value, "%");
    return value[plain] == '\0' ? plain : plain + MHD_http_unescape(value + plain);
}

// Like the option wrappers above, for MHD_OPTION_UNESCAPE_CALLBACK, whose callback type the
// header does not name: the server's, which calls CMicroHTTPD_unescape.
typedef size_t (*CMicroHTTPD_unescape_callback)(void *cls, struct MHD_Connection *connection, char *value);
static inline struct MHD_OptionItem CMicroHTTPD_option_unescape(CMicroHTTPD_unescape_callback callback, void *cls) {
    struct MHD_OptionItem item = { MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)callback, cls };
    return item;
}

static inline enum MHD_Result CMicroHTTPD_yes(void) { return MHD_YES; }
static inline enum MHD_Result CMicroHTTPD_no(void) { return MHD_NO; }

#endif
