/* What the broker does with keys: loaded into the broker with LD_PRELOAD by test_reload.py.
 *
 * Appends one line to the file named by KEY_LOG for each key the broker generates (a call of
 * EVP_PKEY_Q_keygen, which EVP_RSA_gen and EVP_EC_gen expand to: "keygen RSA", "keygen EC"), and
 * for each file it opens under the directory named by KEY_LOG_DIRECTORY ("open PATH"). Every
 * call is the real one, made after the line is written.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void note(const char *what, const char *detail) {
    const char *log = getenv("KEY_LOG");
    if (log == NULL) return;
    char line[4200];
    int length = snprintf(line, sizeof line, "%s %s\n", what, detail);
    if (length <= 0 || length >= (int)sizeof line) return;
    /* The raw system call: the open below would otherwise come back here. */
    int fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    /* One write of a short line to a file opened with O_APPEND: lines from threads never mix. */
    ssize_t written = write(fd, line, (size_t)length);
    (void)written;
    close(fd);
}

static void note_open(const char *path) {
    const char *directory = getenv("KEY_LOG_DIRECTORY");
    if (directory == NULL || path == NULL) return;
    size_t length = strlen(directory);
    if (length == 0 || strncmp(path, directory, length) != 0 || path[length] != '/') return;
    note("open", path);
}

static void *real(const char *symbol) {
    void *function = dlsym(RTLD_NEXT, symbol);
    if (function == NULL) abort();
    return function;
}

EVP_PKEY *EVP_PKEY_Q_keygen(OSSL_LIB_CTX *context, const char *properties, const char *type, ...) {
    EVP_PKEY *(*keygen)(OSSL_LIB_CTX *, const char *, const char *, ...) = real("EVP_PKEY_Q_keygen");
    note("keygen", type);
    va_list arguments;
    va_start(arguments, type);
    EVP_PKEY *key;
    /* The one argument each type takes (see EVP_PKEY_Q_keygen(3)). */
    if (strcmp(type, "RSA") == 0) {
        size_t bits = va_arg(arguments, size_t);
        key = keygen(context, properties, type, bits);
    } else if (strcmp(type, "EC") == 0) {
        const char *curve = va_arg(arguments, const char *);
        key = keygen(context, properties, type, curve);
    } else {
        key = keygen(context, properties, type);
    }
    va_end(arguments);
    return key;
}

static mode_t mode_argument(int flags, va_list arguments) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(arguments, int) : 0;
}

#define OPEN(name)                                                                                 \
    int name(const char *path, int flags, ...) {                                                   \
        int (*call)(const char *, int, ...) = real(#name);                                         \
        va_list arguments;                                                                         \
        va_start(arguments, flags);                                                                \
        mode_t mode = mode_argument(flags, arguments);                                             \
        va_end(arguments);                                                                         \
        note_open(path);                                                                           \
        return call(path, flags, mode);                                                            \
    }

#define OPENAT(name)                                                                               \
    int name(int directory, const char *path, int flags, ...) {                                    \
        int (*call)(int, const char *, int, ...) = real(#name);                                    \
        va_list arguments;                                                                         \
        va_start(arguments, flags);                                                                \
        mode_t mode = mode_argument(flags, arguments);                                             \
        va_end(arguments);                                                                         \
        note_open(path);                                                                           \
        return call(directory, path, flags, mode);                                                 \
    }

OPEN(open)
OPEN(open64)
OPENAT(openat)
OPENAT(openat64)
