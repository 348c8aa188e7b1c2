/* A slow disk, for one call: loaded into the broker with LD_PRELOAD by test_reload.py.
 *
 * While the file named by SLOW_DISK_TRIGGER exists, the next call of the kind SLOW_DISK_CALL
 * names on a token file's temporary file (a name holding ".tmp-") renames the trigger to
 * TRIGGER.taken, so that the test knows a write is held up and only one is, and sleeps
 * SLOW_DISK_SECONDS (default 6) before doing the real call. SLOW_DISK_CALL is "create" (an
 * openat with O_CREAT; the default) or "rename" (a renameat from such a name). Every other call
 * is the real one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void hold_up(const char *call, const char *path) {
    const char *trigger = getenv("SLOW_DISK_TRIGGER");
    const char *held = getenv("SLOW_DISK_CALL");
    if (held == NULL) held = "create";
    if (trigger == NULL || strcmp(call, held) != 0 || strstr(path, ".tmp-") == NULL) return;
    char taken[4096];
    if (snprintf(taken, sizeof taken, "%s.taken", trigger) >= (int)sizeof taken) return;
    if (rename(trigger, taken) != 0) return;
    const char *seconds = getenv("SLOW_DISK_SECONDS");
    sleep(seconds != NULL ? (unsigned)atoi(seconds) : 6);
}

static int call_openat(const char *symbol, int directory, const char *path, int flags, mode_t mode) {
    int (*real)(int, const char *, int, ...) = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, symbol);
    if (real == NULL) abort();
    if (flags & O_CREAT) hold_up("create", path);
    return real(directory, path, flags, mode);
}

/* openat and openat64 take a mode only with O_CREAT or O_TMPFILE, as a variadic argument. */
#define MODE_OF(flags, last) \
    ({ \
        mode_t mode = 0; \
        if ((flags) & (O_CREAT | O_TMPFILE)) { \
            va_list arguments; \
            va_start(arguments, last); \
            mode = (mode_t)va_arg(arguments, int); \
            va_end(arguments); \
        } \
        mode; \
    })

int openat(int directory, const char *path, int flags, ...) {
    return call_openat("openat", directory, path, flags, MODE_OF(flags, flags));
}

int openat64(int directory, const char *path, int flags, ...) {
    return call_openat("openat64", directory, path, flags, MODE_OF(flags, flags));
}

int renameat(int old_directory, const char *old_path, int new_directory, const char *new_path) {
    int (*real)(int, const char *, int, const char *) =
        (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
    if (real == NULL) abort();
    hold_up("rename", old_path);
    return real(old_directory, old_path, new_directory, new_path);
}
