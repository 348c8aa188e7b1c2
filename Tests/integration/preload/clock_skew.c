/* A host whose wall clock is off: loaded into the broker with LD_PRELOAD by test_store_trust.py.
 *
 * Every reading of the real-time clock (clock_gettime of CLOCK_REALTIME or CLOCK_REALTIME_COARSE,
 * gettimeofday, time) is moved by CLOCK_SKEW_SECONDS, a whole number, ahead when positive (default
 * 0). The monotonic clocks are left alone, as a host's are when only its wall clock is wrong.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew(void) {
    const char *seconds = getenv("CLOCK_SKEW_SECONDS");
    return seconds != NULL ? atol(seconds) : 0;
}

int clock_gettime(clockid_t clock, struct timespec *time) {
    static int (*real)(clockid_t, struct timespec *);
    if (real == NULL) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(clock, time);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) time->tv_sec += skew();
    return result;
}

int gettimeofday(struct timeval *restrict value, void *restrict zone) {
    (void)zone;
    struct timespec now;
    int result = clock_gettime(CLOCK_REALTIME, &now);
    if (result == 0 && value != NULL) {
        value->tv_sec = now.tv_sec;
        value->tv_usec = now.tv_nsec / 1000;
    }
    return result;
}

time_t time(time_t *stored) {
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) return (time_t)-1;
    if (stored != NULL) *stored = now.tv_sec;
    return now.tv_sec;
}
