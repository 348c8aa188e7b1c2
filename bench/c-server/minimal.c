/*
 * The baseline for the cached-token benchmark: a minimal libmicrohttpd server in C that answers
 * every request with one prebuilt response, using the same daemon flags and limits as
 * token-broker's token listener (epoll, turbo, a pool of 2 threads, suspend/resume allowed,
 * 10000 connections, 4 KiB per connection, 30 s timeout; answers queued on the second call).
 *
 *   cc -O2 -o minimal minimal.c -lmicrohttpd
 *   ./minimal PORT BODY_FILE      (prints "listening 127.0.0.1:PORT" and runs until SIGTERM)
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct MHD_Response *response;
static char marker;

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)cls; (void)url; (void)method; (void)version; (void)upload_data;
    if (*con_cls == NULL) {
        *con_cls = &marker;
        return MHD_YES;
    }
    *upload_data_size = 0;
    return MHD_queue_response(connection, MHD_HTTP_OK, response);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT BODY_FILE\n", argv[0]);
        return 2;
    }
    FILE *file = fopen(argv[2], "rb");
    if (file == NULL) return 1;
    static char body[65536];
    size_t length = fread(body, 1, sizeof body, file);
    fclose(file);
    response = MHD_create_response_from_buffer(length, body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(response, "Content-Type", "application/json");
    MHD_add_response_header(response, "Cache-Control", "no-store");
    MHD_add_response_header(response, "ETag", "\"1\"");

    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    struct MHD_Daemon *daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO, 0, NULL, NULL,
        answer, NULL, MHD_OPTION_SOCK_ADDR, &address, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)10000,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)2, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)4096, MHD_OPTION_END);
    if (daemon == NULL) return 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    printf("listening 127.0.0.1:%u\n", info->port);
    fflush(stdout);
    int received;
    sigwait(&stop, &received);
    MHD_stop_daemon(daemon);
    MHD_destroy_response(response);
    return 0;
}
