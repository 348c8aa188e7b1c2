/*
 * Opens N long-polls at once and reports when each is answered: the client side of the
 * long-poll benchmark, in C so that the client's own speed does not hide the server's.
 *
 *   cc -O2 -o longpoll longpoll.c
 *   ./longpoll HOST PORT COUNT AFTER_VERSION
 *
 * Connects COUNT sockets to HOST:PORT (loopback), sends on each
 *   GET /token/ready?after=AFTER_VERSION&timeout=60  (Connection: close)
 * prints "sent" once all are written, then reads every answer to its end with epoll. For each
 * answer it prints one line: "<CLOCK_MONOTONIC seconds> <status> <1 if the body holds
 * "version":AFTER_VERSION+1, else 0>". Gives up after 90 s.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct waiter {
    int fd;
    size_t length;
    char buffer[2048];
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s HOST PORT COUNT AFTER_VERSION\n", argv[0]);
        return 2;
    }
    int count = atoi(argv[3]);
    long after = atol(argv[4]);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) return 2;
    char request[256];
    int request_length = snprintf(request, sizeof request,
                                  "GET /token/ready?after=%ld&timeout=60 HTTP/1.1\r\nHost: bench\r\n"
                                  "Token-Broker-Request: true\r\nConnection: close\r\n\r\n", after);
    char expected[64];
    snprintf(expected, sizeof expected, "\"version\":%ld", after + 1);

    struct waiter *waiters = calloc((size_t)count, sizeof *waiters);
    int epoll = epoll_create1(0);
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
            fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
            return 1;
        }
        if (write(fd, request, (size_t)request_length) != request_length) return 1;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        waiters[i].fd = fd;
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
    }
    printf("sent\n");
    fflush(stdout);

    int open = count;
    double deadline = now() + 90;
    struct epoll_event events[256];
    while (open > 0 && now() < deadline) {
        int ready = epoll_wait(epoll, events, 256, 1000);
        for (int e = 0; e < ready; e++) {
            struct waiter *w = &waiters[events[e].data.u32];
            for (;;) {
                char chunk[4096];
                ssize_t got = read(w->fd, chunk, sizeof chunk);
                if (got > 0) {
                    size_t room = sizeof w->buffer - 1 - w->length;
                    size_t take = (size_t)got < room ? (size_t)got : room;
                    memcpy(w->buffer + w->length, chunk, take);
                    w->length += take;
                    continue;
                }
                if (got < 0 && errno == EAGAIN) break;
                double at = now();
                w->buffer[w->length] = 0;
                int status = 0;
                sscanf(w->buffer, "HTTP/1.1 %d", &status);
                printf("%.6f %d %d\n", at, status, strstr(w->buffer, expected) != NULL);
                epoll_ctl(epoll, EPOLL_CTL_DEL, w->fd, NULL);
                close(w->fd);
                open--;
                break;
            }
        }
    }
    fflush(stdout);
    return open == 0 ? 0 : 1;
}
