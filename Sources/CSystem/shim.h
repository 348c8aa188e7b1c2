// System headers that Glibc's Swift module leaves out: epoll and eventfd for the server's
// hang-up watcher, malloc.h for handing memory back after bursts and for allocator tuning,
// sys/xattr.h for finding a default ACL on a token file's directory.
#ifndef CSYSTEM_SHIM_H
#define CSYSTEM_SHIM_H

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <malloc.h>
#include <sys/xattr.h>

#endif
