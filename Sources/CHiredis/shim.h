// hiredis (Debian 12: libhiredis-dev, 0.14), the Redis client of the token store's `redis` kind.
// Its blocking API is used from threads of the store's own, never from a server thread or
// Swift's cooperative pool. Everything is called straight from Swift; nothing needs a wrapper.
#ifndef CHIREDIS_SHIM_H
#define CHIREDIS_SHIM_H

#include <hiredis/hiredis.h>

#endif
