/* The proxy floor: what libmicrohttpd and libcurl, the broker's two libraries, reach as a proxy
   when nothing else runs, in C, in the fastest arrangement found for them (BENCHMARKS.md, issue 19).

   Each of THREADS threads owns one libmicrohttpd daemon (external epoll, the listening port
   shared through SO_REUSEPORT) and one curl multi handle driven by curl_multi_socket_action, both
   on the thread's own epoll set: a request is read, sent upstream, answered and written on the
   one thread that accepted it, and no thread wakes another. Connections to the upstream stay in
   the epoll set between transfers, so a kept-alive connection costs no epoll_ctl per request.

   It does what a proxied GET needs and nothing more, which is what makes it a floor:
   GET /proxy/u/PATH goes to http://UPSTREAM/PATH with "Authorization: Bearer TOKEN" (the token
   read from TOKEN_FILE, so that the request head is as long as the broker's); the answer's status
   and body come back, buffered whole. No other method, no header passed either way, no checks.

   usage: floor PORT UPSTREAM_HOST:PORT TOKEN_FILE [THREADS]    (listens on 127.0.0.1) */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define MAX_FD 65536
#define SPARE_HANDLES 256

static char upstream[256];
static char authorization[8192];

/* One proxied request. */
struct exchange {
  struct MHD_Connection *connection;
  char *body;
  size_t length, capacity;
  long status;
  int started, done;
};

/* One thread: its daemon, its multi handle, its epoll set. */
struct worker {
  pthread_t thread;
  int epoll;
  struct MHD_Daemon *daemon;
  CURLM *multi;
  long curl_timeout; /* ms; -1: none */
  int resumed;       /* a connection was resumed: run the daemon this turn */
  CURL *spare[SPARE_HANDLES];
  int spares;
  struct curl_slist *headers;
};

static char daemon_tag; /* epoll data for the daemon's own epoll descriptor */

/* Per thread, for curl's sockets: the events registered in epoll (-1: not in the set) and the
   events curl wants now (0: none; the socket stays in the set, muted if it fires). */
static __thread signed char registered[MAX_FD];
static __thread signed char wanted[MAX_FD];

static void fail(const char *what) {
  perror(what);
  exit(1);
}

static size_t on_body(char *data, size_t size, size_t count, void *context) {
  struct exchange *x = context;
  size_t n = size * count;
  if (x->length + n > x->capacity) {
    size_t capacity = (x->length + n) * 2;
    char *grown = realloc(x->body, capacity);
    if (!grown) return 0;
    x->body = grown;
    x->capacity = capacity;
  }
  memcpy(x->body + x->length, data, n);
  x->length += n;
  return n;
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *context, void *socket_context) {
  (void)easy;
  (void)socket_context;
  struct worker *w = context;
  if (fd < 0 || fd >= MAX_FD) return -1;
  if (what == CURL_POLL_REMOVE) {
    wanted[fd] = 0;
    return 0;
  }
  int events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
  wanted[fd] = (signed char)events;
  if (registered[fd] == events) return 0;
  struct epoll_event event = {.events = (uint32_t)events, .data.u64 = (uint64_t)fd + 1};
  if (epoll_ctl(w->epoll, registered[fd] < 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event) != 0) return -1;
  registered[fd] = (signed char)events;
  return 0;
}

static int on_timer(CURLM *multi, long timeout_ms, void *context) {
  (void)multi;
  ((struct worker *)context)->curl_timeout = timeout_ms; /* acted on by the loop */
  return 0;
}

static int on_close(void *context, curl_socket_t fd) {
  (void)context;
  if (fd >= 0 && fd < MAX_FD) {
    registered[fd] = -1; /* closing drops it from the epoll set */
    wanted[fd] = 0;
  }
  return close(fd);
}

static CURL *easy_handle(struct worker *w) {
  if (w->spares) return w->spare[--w->spares];
  CURL *easy = curl_easy_init();
  if (!easy) return NULL;
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, w->headers);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_PROXY, "");
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, on_close);
  return easy;
}

static void collect(struct worker *w) {
  CURLMsg *message;
  int left;
  while ((message = curl_multi_info_read(w->multi, &left))) {
    if (message->msg != CURLMSG_DONE) continue;
    CURL *easy = message->easy_handle;
    struct exchange *x;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (message->data.result == CURLE_OK) curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &x->status);
    else x->status = 502;
    curl_multi_remove_handle(w->multi, easy);
    if (message->data.result == CURLE_OK && w->spares < SPARE_HANDLES) w->spare[w->spares++] = easy;
    else curl_easy_cleanup(easy);
    x->done = 1;
    MHD_resume_connection(x->connection);
    w->resumed = 1;
  }
}

static enum MHD_Result answer(struct MHD_Connection *connection, unsigned status, size_t length, void *body,
                              enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *response = MHD_create_response_from_buffer(length, body, mode);
  if (!response) return MHD_NO;
  enum MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

static enum MHD_Result handle(void *context, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **request) {
  (void)version;
  (void)data;
  (void)size;
  struct worker *w = context;
  struct exchange *x = *request;
  if (!x) {
    if (strcmp(method, "GET") != 0 || strncmp(url, "/proxy/u/", 9) != 0)
      return answer(connection, 404, 9, "not found", MHD_RESPMEM_PERSISTENT);
    x = calloc(1, sizeof *x);
    if (!x) return MHD_NO;
    *request = x;
    return MHD_YES; /* libmicrohttpd calls again once the head is read whole */
  }
  if (!x->started) {
    char target[2048];
    int n = snprintf(target, sizeof target, "http://%s/%s", upstream, url + 9);
    CURL *easy = n > 0 && (size_t)n < sizeof target ? easy_handle(w) : NULL;
    if (!easy) return answer(connection, 502, 0, "", MHD_RESPMEM_PERSISTENT);
    x->started = 1;
    x->connection = connection;
    curl_easy_setopt(easy, CURLOPT_URL, target);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, x);
    MHD_suspend_connection(connection);
    if (curl_multi_add_handle(w->multi, easy) != CURLM_OK) {
      curl_easy_cleanup(easy);
      x->status = 502;
      x->done = 1;
      MHD_resume_connection(connection);
      w->resumed = 1;
    }
    return MHD_YES;
  }
  if (!x->done) return MHD_YES;
  if (!x->body) return answer(connection, (unsigned)x->status, 0, "", MHD_RESPMEM_PERSISTENT);
  struct MHD_Response *response = MHD_create_response_from_buffer(x->length, x->body, MHD_RESPMEM_MUST_FREE);
  if (!response) return MHD_NO; /* the body is freed when the request completes */
  x->body = NULL;               /* the response frees it */
  enum MHD_Result queued = MHD_queue_response(connection, (unsigned)x->status, response);
  MHD_destroy_response(response);
  return queued;
}

static void completed(void *context, struct MHD_Connection *connection, void **request,
                      enum MHD_RequestTerminationCode code) {
  (void)context;
  (void)connection;
  (void)code;
  struct exchange *x = *request;
  if (x) {
    free(x->body);
    free(x);
    *request = NULL;
  }
}

static void *run(void *context) {
  struct worker *w = context;
  memset(registered, -1, sizeof registered);
  struct epoll_event events[128];
  for (;;) {
    int timeout = -1;
    MHD_UNSIGNED_LONG_LONG daemon_timeout;
    if (w->resumed) timeout = 0;
    else if (MHD_get_timeout(w->daemon, &daemon_timeout) == MHD_YES)
      timeout = daemon_timeout > 1000 ? 1000 : (int)daemon_timeout;
    if (w->curl_timeout >= 0 && (timeout < 0 || w->curl_timeout < timeout)) timeout = (int)w->curl_timeout;
    int n = epoll_wait(w->epoll, events, 128, timeout);
    if (n < 0) {
      if (errno != EINTR) fail("epoll_wait");
      n = 0;
    }
    int run_daemon = w->resumed || n == 0, running;
    for (int i = 0; i < n; i++) {
      if (events[i].data.ptr == &daemon_tag) {
        run_daemon = 1;
        continue;
      }
      int fd = (int)(events[i].data.u64 - 1);
      if (!wanted[fd]) { /* an idle kept-alive connection: mute it until curl wants it again */
        if (events[i].events & (EPOLLERR | EPOLLHUP)) { /* reported even when muted: drop it */
          if (epoll_ctl(w->epoll, EPOLL_CTL_DEL, fd, NULL) == 0) registered[fd] = -1;
        } else if (registered[fd] != 0) {
          struct epoll_event muted = {.events = 0, .data.u64 = (uint64_t)fd + 1};
          if (epoll_ctl(w->epoll, EPOLL_CTL_MOD, fd, &muted) == 0) registered[fd] = 0;
        }
        continue;
      }
      uint32_t e = events[i].events;
      int flags = (e & EPOLLIN ? CURL_CSELECT_IN : 0) | (e & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                  (e & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(w->multi, fd, flags, &running);
    }
    if (w->curl_timeout == 0 || (n == 0 && w->curl_timeout > 0)) {
      w->curl_timeout = -1;
      curl_multi_socket_action(w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    collect(w);
    if (run_daemon) {
      w->resumed = 0;
      MHD_run(w->daemon); /* answers resumed connections, reads new requests, starts transfers */
      if (w->curl_timeout == 0) { /* start the new transfers in this same turn */
        w->curl_timeout = -1;
        curl_multi_socket_action(w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        collect(w);
      }
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4 || argc > 5) {
    fprintf(stderr, "usage: floor PORT UPSTREAM_HOST:PORT TOKEN_FILE [THREADS]\n");
    return 2;
  }
  long port = strtol(argv[1], NULL, 10);
  int threads = argc > 4 ? atoi(argv[4]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (port <= 0 || port > 65535 || threads < 1 || threads > 64) {
    fprintf(stderr, "floor: bad port or thread count\n");
    return 2;
  }
  snprintf(upstream, sizeof upstream, "%s", argv[2]);
  FILE *file = fopen(argv[3], "r");
  if (!file) fail(argv[3]);
  char token[sizeof authorization - 32];
  size_t length = fread(token, 1, sizeof token - 1, file);
  fclose(file);
  while (length > 0 && (token[length - 1] == '\n' || token[length - 1] == '\r')) length--;
  token[length] = 0;
  snprintf(authorization, sizeof authorization, "Authorization: Bearer %s", token);

  signal(SIGPIPE, SIG_IGN);
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 1;
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct worker *workers = calloc((size_t)threads, sizeof *workers);
  if (!workers) return 1;
  for (int i = 0; i < threads; i++) {
    struct worker *w = &workers[i];
    w->curl_timeout = -1;
    w->epoll = epoll_create1(EPOLL_CLOEXEC);
    w->headers = curl_slist_append(NULL, authorization);
    w->multi = curl_multi_init();
    if (w->epoll < 0 || !w->headers || !w->multi) fail("set-up");
    curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, 256L);
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETDATA, w);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERDATA, w);
    /* The broker's flags, less its internal thread. In external mode a resume only sets a flag
       (no inter-thread signal): the loop runs the daemon itself after resuming. */
    w->daemon = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO, (uint16_t)port, NULL, NULL,
        handle, w, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_LIMIT, 10000u,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)4096, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&address, MHD_OPTION_END);
    if (!w->daemon) {
      fprintf(stderr, "floor: libmicrohttpd could not start\n");
      return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(w->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = &daemon_tag};
    if (!info || epoll_ctl(w->epoll, EPOLL_CTL_ADD, info->epoll_fd, &event) != 0) fail("epoll_ctl");
    MHD_run(w->daemon); /* adds the listening socket to the daemon's epoll set */
  }
  for (int i = 0; i < threads; i++)
    if (pthread_create(&workers[i].thread, NULL, run, &workers[i]) != 0) fail("pthread_create");
  printf("listening on 127.0.0.1:%ld\n", port);
  fflush(stdout);
  for (;;) pause();
}
