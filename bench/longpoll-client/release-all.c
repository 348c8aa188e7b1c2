/*
 * The floor under the long-poll benchmark: a server that holds N requests, then on "go" (a
 * line on stdin) answers them all as fast as this machine allows, with 2 threads like the
 * broker's pool, each writing a fixed ~600-byte answer (and, in close mode, closing). No HTTP
 * library, no waiter bookkeeping: what remains is the kernel's cost to send N answers.
 *
 *   cc -O2 -pthread -o release-all release-all.c
 *   ./release-all COUNT keep-alive|close
 *
 * Prints "listening 127.0.0.1:PORT", then "held" once COUNT requests arrived; after answering,
 * keeps the sockets open until stdin ends.
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static int *fds;
static int count;
static int keep_alive;
static char answer[1024];
static size_t answer_length;

static void *release(void *half) {
    long which = (long)half;
    for (int i = (int)which; i < count; i += 2) {
        if (write(fds[i], answer, answer_length) < 0) perror("write");
        if (!keep_alive) close(fds[i]);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "keep-alive") != 0 && strcmp(argv[2], "close") != 0)) return 2;
    count = atoi(argv[1]);
    keep_alive = strcmp(argv[2], "keep-alive") == 0;
    fds = calloc((size_t)count, sizeof *fds);
    char body[640];
    int body_length = snprintf(body, sizeof body, "{\"version\":0,\"pad\":\"%0600d\"}", 0);
    answer_length = (size_t)snprintf(answer, sizeof answer,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s",
        body_length, keep_alive ? "" : "Connection: close\r\n", body);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int yes = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    struct sockaddr_in address = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 4096)) return 1;
    socklen_t length = sizeof address;
    getsockname(listener, (struct sockaddr *)&address, &length);
    printf("listening 127.0.0.1:%d\n", ntohs(address.sin_port));
    fflush(stdout);
    for (int i = 0; i < count; i++) {
        fds[i] = accept(listener, NULL, NULL);
        char request[1024];
        size_t got = 0;
        while (got < 4 || memcmp(request + got - 4, "\r\n\r\n", 4) != 0) {
            ssize_t n = read(fds[i], request + got, sizeof request - got);
            if (n <= 0) return 1;
            got += (size_t)n;
        }
    }
    printf("held\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    pthread_t threads[2];
    for (long t = 0; t < 2; t++) pthread_create(&threads[t], NULL, release, (void *)t);
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
