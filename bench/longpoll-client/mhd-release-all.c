/*
 * The second floor under the long-poll benchmark: libmicrohttpd alone, with token-broker's daemon
 * flags and limits (epoll, turbo, suspend/resume, a pool of 2 threads, 4 KiB per connection). It
 * suspends every request it gets; once COUNT are held it prints "held", and on "go" (a line on
 * stdin) one thread resumes them all, each answered with one prebuilt ~600-byte response. No
 * provider, no waiter bookkeeping, no Swift: what remains is libmicrohttpd's cost to wake and
 * answer N suspended connections. Timed by the same client as the broker and release-all.c.
 *
 *   cc -O2 -pthread -o mhd-release-all mhd-release-all.c -lmicrohttpd
 *   ./mhd-release-all COUNT      (prints "listening 127.0.0.1:PORT", then "held"; stops at stdin's end)
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct MHD_Response *response;
static struct MHD_Connection **held;
static int count;
static int suspended;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char arrived, answerable;

static enum MHD_Result handle(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **state) {
    (void)cls; (void)url; (void)method; (void)version; (void)upload_data;
    *upload_data_size = 0;
    if (*state == NULL) { /* headers only: come back for the whole request, as the broker does */
        *state = &arrived;
        return MHD_YES;
    }
    if (*state == &answerable) return MHD_queue_response(connection, MHD_HTTP_OK, response);
    *state = &answerable;
    pthread_mutex_lock(&lock);
    int index = suspended < count ? suspended++ : -1;
    if (index >= 0) held[index] = connection;
    pthread_mutex_unlock(&lock);
    if (index < 0) return MHD_queue_response(connection, MHD_HTTP_OK, response);
    MHD_suspend_connection(connection);
    if (index == count - 1) {
        printf("held\n");
        fflush(stdout);
    }
    return MHD_YES;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    count = atoi(argv[1]);
    held = calloc((size_t)count, sizeof *held);
    static char body[640];
    int body_length = snprintf(body, sizeof body, "{\"version\":0,\"pad\":\"%0600d\"}", 0);
    response = MHD_create_response_from_buffer((size_t)body_length, body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(response, "Content-Type", "application/json");
    struct sockaddr_in address = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    struct MHD_Daemon *daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO, 0, NULL, NULL,
        handle, NULL, MHD_OPTION_SOCK_ADDR, &address, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)(count + 100),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)60,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)2, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)4096, MHD_OPTION_END);
    if (daemon == NULL) return 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    printf("listening 127.0.0.1:%u\n", info->port);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < count; i++) MHD_resume_connection(held[i]);
    while (fgets(line, sizeof line, stdin)) {}
    MHD_stop_daemon(daemon);
    return 0;
}
