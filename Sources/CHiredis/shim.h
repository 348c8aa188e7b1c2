// hiredis (Debian 12: libhiredis-dev, 0.14), the Redis client of the token store's `redis` kind.
// Its blocking API is used from threads of the store's own, never from a server thread or
// Swift's cooperative pool. Everything is called straight from Swift but the reply bounds below.
#ifndef CHIREDIS_SHIM_H
#define CHIREDIS_SHIM_H

#include <hiredis/hiredis.h>
#include <stddef.h>

/// Why the reader refused the reply it was reading (`CHiredis_ReplyBounds.refused`).
enum {
    CHiredis_RefusedNothing = 0,
    CHiredis_RefusedLongString = 1,
    CHiredis_RefusedLongArray = 2,
    CHiredis_RefusedNestedArray = 3,
};

/// The replies a connection's reader builds: hiredis 0.14 makes an array's table of elements as
/// soon as it reads the array's head, so `*2147483647` (13 bytes) costs 16 GB of address space and,
/// when the reply is freed, a walk of 2^31 pointers. These limits refuse such a reply at its head:
/// the reader's functions return NULL, which hiredis reports as an error (it says "Out of memory";
/// `refused` says what it was), and the connection is dropped.
typedef struct CHiredis_ReplyBounds {
    /// The functions the reader calls: the checks below, then hiredis's own.
    redisReplyObjectFunctions functions;
    /// hiredis's own functions, which build every reply the checks let through.
    redisReplyObjectFunctions *hiredis;
    /// The longest string (bulk, status or error) a reply may hold.
    size_t longestString;
    /// The most elements an array may have; an array inside an array is refused.
    int mostElements;
    /// Why the last reply was refused, or CHiredis_RefusedNothing.
    int refused;
} CHiredis_ReplyBounds;

// The checks, each then calling hiredis's own; static inline so that the header needs no library.
static inline void *CHiredis_createString(const redisReadTask *task, char *text, size_t length) {
    CHiredis_ReplyBounds *bounds = (CHiredis_ReplyBounds *)task->privdata;
    if (length > bounds->longestString) {
        bounds->refused = CHiredis_RefusedLongString;
        return NULL;
    }
    return bounds->hiredis->createString(task, text, length);
}

static inline void *CHiredis_createArray(const redisReadTask *task, int elements) {
    CHiredis_ReplyBounds *bounds = (CHiredis_ReplyBounds *)task->privdata;
    if (task->parent != NULL) {
        bounds->refused = CHiredis_RefusedNestedArray;
        return NULL;
    }
    if (elements > bounds->mostElements) {
        bounds->refused = CHiredis_RefusedLongArray;
        return NULL;
    }
    return bounds->hiredis->createArray(task, elements);
}

static inline void *CHiredis_createInteger(const redisReadTask *task, long long value) {
    return ((CHiredis_ReplyBounds *)task->privdata)->hiredis->createInteger(task, value);
}

static inline void *CHiredis_createNil(const redisReadTask *task) {
    return ((CHiredis_ReplyBounds *)task->privdata)->hiredis->createNil(task);
}

/// Puts `bounds` between `context`'s reader and hiredis's functions, before any reply is read;
/// `bounds` must outlive the context (free it after `redisFree`). In C, as the checks are: the
/// reader calls them through C function pointers, and hiredis's own are static in its library.
static inline void CHiredis_boundReplies(
    redisContext *context, CHiredis_ReplyBounds *bounds, size_t longestString, int mostElements) {
    redisReader *reader = context->reader;
    bounds->hiredis = reader->fn;
    bounds->functions.createString = CHiredis_createString;
    bounds->functions.createArray = CHiredis_createArray;
    bounds->functions.createInteger = CHiredis_createInteger;
    bounds->functions.createNil = CHiredis_createNil;
    bounds->functions.freeObject = reader->fn->freeObject;
    bounds->longestString = longestString;
    bounds->mostElements = mostElements;
    bounds->refused = CHiredis_RefusedNothing;
    reader->fn = &bounds->functions;
    reader->privdata = bounds;
}

#endif
