/*
 * Opens N long-polls at once and reports when each is answered: the client side of the
 * long-poll benchmark, in C so that the client's own speed does not hide the server's.
 *
 *   cc -O2 -o longpoll longpoll.c
 *   ./longpoll HOST PORT COUNT AFTER_VERSION keep-alive|close
 *
 * Connects COUNT sockets to HOST:PORT (loopback), sends on each
 *   GET /token/ready?after=AFTER_VERSION&timeout=60
 * (with "Connection: close" in close mode), prints "sent" once all are written, then reads
 * every answer with epoll. For each answer it prints one line:
 *
 *   <arrived> <status> <1 if the body holds "version":AFTER_VERSION+1, else 0> <read>
 *
 * `arrived` is the kernel's receive timestamp (SO_TIMESTAMPNS) of the bytes that completed the
 * answer: when the answer reached this socket, however long this one thread took to get to it.
 * `read` is when this program read them. Both are CLOCK_MONOTONIC seconds. In close mode a
 * socket is read to its end and closed; in keep-alive mode sockets stay open until every answer
 * is in, as a client that polls again would keep them. Gives up after 90 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct waiter {
    int fd;
    size_t length;
    double arrived;
    char buffer[2048];
};

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether the buffer holds a whole answer: its head and Content-Length bytes of body. */
static int complete(struct waiter *w) {
    w->buffer[w->length] = 0;
    char *end = strstr(w->buffer, "\r\n\r\n");
    char *field = strcasestr(w->buffer, "\r\ncontent-length:");
    if (!end || !field || field > end) return 0;
    return w->length >= (size_t)(end + 4 - w->buffer) + (size_t)atol(field + 17);
}

int main(int argc, char **argv) {
    if (argc != 6 || (strcmp(argv[5], "keep-alive") != 0 && strcmp(argv[5], "close") != 0)) {
        fprintf(stderr, "usage: %s HOST PORT COUNT AFTER_VERSION keep-alive|close\n", argv[0]);
        return 2;
    }
    int count = atoi(argv[3]);
    long after = atol(argv[4]);
    int keep_alive = strcmp(argv[5], "keep-alive") == 0;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) return 2;
    char request[256];
    int request_length = snprintf(request, sizeof request,
                                  "GET /token/ready?after=%ld&timeout=60 HTTP/1.1\r\nHost: bench\r\n"
                                  "Token-Broker-Request: true\r\n%s\r\n", after, keep_alive ? "" : "Connection: close\r\n");
    char expected[64];
    snprintf(expected, sizeof expected, "\"version\":%ld", after + 1);
    /* Receive timestamps are CLOCK_REALTIME; the caller times the refresh on CLOCK_MONOTONIC. */
    double realtime_ahead = seconds(CLOCK_REALTIME) - seconds(CLOCK_MONOTONIC);

    struct waiter *waiters = calloc((size_t)count, sizeof *waiters);
    int epoll = epoll_create1(0);
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
            fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
            return 1;
        }
        int on = 1;
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
        if (write(fd, request, (size_t)request_length) != request_length) return 1;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        waiters[i].fd = fd;
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
    }
    printf("sent\n");
    fflush(stdout);

    int open = count;
    double deadline = seconds(CLOCK_MONOTONIC) + 90;
    struct epoll_event events[256];
    while (open > 0 && seconds(CLOCK_MONOTONIC) < deadline) {
        int ready = epoll_wait(epoll, events, 256, 1000);
        for (int e = 0; e < ready; e++) {
            struct waiter *w = &waiters[events[e].data.u32];
            int done = 0;
            for (;;) {
                char chunk[4096];
                char control[CMSG_SPACE(sizeof(struct timespec))];
                struct iovec part = {chunk, sizeof chunk};
                struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
                ssize_t got = recvmsg(w->fd, &message, 0);
                if (got < 0 && errno == EAGAIN) break;
                if (got <= 0) {
                    done = 1;
                    break;
                }
                int was_complete = complete(w);
                size_t room = sizeof w->buffer - 1 - w->length;
                size_t take = (size_t)got < room ? (size_t)got : room;
                memcpy(w->buffer + w->length, chunk, take);
                w->length += take;
                if (!was_complete && complete(w)) {
                    for (struct cmsghdr *c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
                        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                            struct timespec at;
                            memcpy(&at, CMSG_DATA(c), sizeof at);
                            w->arrived = at.tv_sec + at.tv_nsec / 1e9 - realtime_ahead;
                        }
                    }
                    if (keep_alive) {
                        done = 1;
                        break;
                    }
                }
            }
            if (!done) continue;
            double read_at = seconds(CLOCK_MONOTONIC);
            int status = 0;
            sscanf(w->buffer, "HTTP/1.1 %d", &status);
            printf("%.6f %d %d %.6f\n", w->arrived ? w->arrived : read_at, status, strstr(w->buffer, expected) != NULL, read_at);
            epoll_ctl(epoll, EPOLL_CTL_DEL, w->fd, NULL);
            if (!keep_alive) close(w->fd);
            open--;
        }
    }
    fflush(stdout);
    return open == 0 ? 0 : 1;
}
