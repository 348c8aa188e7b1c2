/* A slow disk, for one call: loaded into the broker with LD_PRELOAD by test_reload.py.
 *
 * While the file named by SLOW_DISK_TRIGGER exists, the next call that creates a token file's
 * temporary file (an openat with O_CREAT of a name holding ".tmp-") renames the trigger to
 * TRIGGER.taken, so that the test knows a write is held up and only one is, and sleeps
 * SLOW_DISK_SECONDS (default 6) before doing the real call. Every other call is the real one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void hold_up(const char *path, int flags) {
    const char *trigger = getenv("SLOW_DISK_TRIGGER");
    if (trigger == NULL || (flags & O_CREAT) == 0 || strstr(path, ".tmp-") == NULL) return;
    char taken[4096];
    if (snprintf(taken, sizeof taken, "%s.taken", trigger) >= (int)sizeof taken) return;
    if (rename(trigger, taken) != 0) return;
    const char *seconds = getenv("SLOW_DISK_SECONDS");
    sleep(seconds != NULL ? (unsigned)atoi(seconds) : 6);
}

static int call_openat(const char *symbol, int directory, const char *path, int flags, mode_t mode) {
    int (*real)(int, const char *, int, ...) = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, symbol);
    if (real == NULL) abort();
    hold_up(path, flags);
    return real(directory, path, flags, mode);
}

int openat(int directory, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list arguments;
        va_start(arguments, flags);
        mode = (mode_t)va_arg(arguments, int);
        va_end(arguments);
    }
    return call_openat("openat", directory, path, flags, mode);
}

int openat64(int directory, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list arguments;
        va_start(arguments, flags);
        mode = (mode_t)va_arg(arguments, int);
        va_end(arguments);
    }
    return call_openat("openat64", directory, path, flags, mode);
}
