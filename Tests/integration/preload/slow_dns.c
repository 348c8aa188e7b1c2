/* A DNS server that does not answer, for one name: loaded into the broker with LD_PRELOAD by
 * test_fleet_faults.py.
 *
 * getaddrinfo for the name SLOW_DNS_NAME sleeps SLOW_DNS_SECONDS (default 10: resolv.conf's
 * `timeout:5 attempts:2` against a server that never answers), then answers as for 127.0.0.1.
 * Every other name, numeric addresses included, gets the real call at once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **result) {
    int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
        (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
    if (real == NULL) abort();
    const char *name = getenv("SLOW_DNS_NAME");
    if (node != NULL && name != NULL && strcmp(node, name) == 0) {
        const char *seconds = getenv("SLOW_DNS_SECONDS");
        sleep(seconds != NULL ? (unsigned)atoi(seconds) : 10);
        return real("127.0.0.1", service, hints, result);
    }
    return real(node, service, hints, result);
}
