/* The proxy floor: what libmicrohttpd and libcurl, the broker's two libraries, reach as a proxy
   when nothing else runs, in C, in the fastest arrangement found for them (BENCHMARKS.md, issue 19).

   Each of THREADS threads owns one libmicrohttpd daemon (external epoll mode, the listening port
   shared through SO_REUSEPORT) and one curl multi handle. The thread waits in curl_multi_poll,
   which watches libcurl's own sockets and, as an extra descriptor, the daemon's epoll set; then
   it runs libcurl (curl_multi_perform) and the daemon (MHD_run). A request is read, sent upstream,
   answered and written on the one thread that accepted it, and no thread wakes another.
   (Driving libcurl through curl_multi_socket_action and one epoll set instead measured the same,
   BENCHMARKS.md; this way keeps libcurl's own poll of its sockets, as the broker's loops do.)

   It does what a proxied GET needs and nothing more, which is what makes it a floor:
   GET /proxy/u/PATH goes to http://UPSTREAM/PATH with "Authorization: Bearer TOKEN" (the token
   read from TOKEN_FILE, so that the request head is as long as the broker's); the answer's status
   and body come back, buffered whole. No other method, no header passed either way, no checks.

   usage: floor PORT UPSTREAM_HOST:PORT TOKEN_FILE [THREADS]    (listens on 127.0.0.1) */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* One thread: its daemon and its multi handle. */
struct worker {
  pthread_t thread;
  struct MHD_Daemon *daemon;
  int daemon_epoll; /* the daemon's epoll set, which curl_multi_poll watches too */
  CURLM *multi;
  int resumed;      /* a connection was resumed: run the daemon this turn */
  CURL *spare[SPARE_HANDLES];
  int spares;
  struct curl_slist *headers;
};

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

static CURL *easy_handle(struct worker *w) {
  if (w->spares) return w->spare[--w->spares];
  CURL *easy = curl_easy_init();
  if (!easy) return NULL;
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, w->headers);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_PROXY, "");
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
  int running;
  for (;;) {
    int timeout = 1000;
    MHD_UNSIGNED_LONG_LONG daemon_timeout;
    if (w->resumed) timeout = 0;
    else if (MHD_get_timeout(w->daemon, &daemon_timeout) == MHD_YES && daemon_timeout < 1000)
      timeout = (int)daemon_timeout;
    struct curl_waitfd daemon_ready = {.fd = w->daemon_epoll, .events = CURL_WAIT_POLLIN};
    int ready = 0;
    if (curl_multi_poll(w->multi, &daemon_ready, 1, timeout, &ready) != CURLM_OK) fail("curl_multi_poll");
    curl_multi_perform(w->multi, &running);
    collect(w);
    /* The daemon runs when its set is ready, a connection was resumed, or the wait timed out
       (libmicrohttpd may have work that leaves its set quiet, such as an answer to write). */
    if (w->resumed || daemon_ready.revents || ready == 0) {
      w->resumed = 0;
      MHD_run(w->daemon); /* answers resumed connections, reads new requests, adds transfers */
      curl_multi_perform(w->multi, &running); /* and sends the new transfers in this same turn */
      collect(w);
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
    w->headers = curl_slist_append(NULL, authorization);
    w->multi = curl_multi_init();
    if (!w->headers || !w->multi) fail("set-up");
    curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, 256L);
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
    if (!info) fail("MHD_get_daemon_info");
    w->daemon_epoll = info->epoll_fd;
    MHD_run(w->daemon); /* adds the listening socket to the daemon's epoll set */
  }
  for (int i = 0; i < threads; i++)
    if (pthread_create(&workers[i].thread, NULL, run, &workers[i]) != 0) fail("pthread_create");
  printf("listening on 127.0.0.1:%ld\n", port);
  fflush(stdout);
  for (;;) pause();
}
