/*
 * Which functions a program runs: a one-shot breakpoint (int3) on the entry of every function
 * listed, each removed the first time a thread reaches it. Prints the entry of each function
 * reached, in the order first reached, until SIGINT or SIGTERM; then kills the program.
 * bench/link-order/generate.py uses it to write the broker's link order.
 *
 *   cc -O2 -o trace trace.c
 *   ./trace ENTRIES -- PROGRAM [ARGS...]
 *
 * ENTRIES: hex offsets of function entries from the executable's load address, one a line
 * (`nm` addresses of a position-independent executable). Needs ptrace rights over the child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;
static void stop(int signal) { (void)signal; stopping = 1; }

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: %s ENTRIES -- PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    FILE *list = fopen(argv[1], "r");
    if (!list) return 2;
    size_t count = 0, room = 1 << 16;
    uint64_t *entries = malloc(room * sizeof *entries);
    char line[512];
    while (fgets(line, sizeof line, list)) {
        if (count == room) entries = realloc(entries, (room *= 2) * sizeof *entries);
        entries[count++] = strtoull(line, NULL, 16);
    }
    qsort(entries, count, sizeof *entries, compare);
    uint8_t *original = calloc(count, 1), *armed = calloc(count, 1);

    pid_t child = fork();
    if (child == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        execvp(argv[3], argv + 3);
        _exit(127);
    }
    int status;
    waitpid(child, &status, 0);
    ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_TRACECLONE | PTRACE_O_EXITKILL | PTRACE_O_TRACEEXEC);
    ptrace(PTRACE_CONT, child, 0, 0);
    waitpid(child, &status, 0); /* at exec: the executable is mapped and nothing of it has run */

    /* The load address: the executable's mapping at file offset 0. */
    char path[64], exe[512];
    snprintf(path, sizeof path, "/proc/%d/exe", child);
    ssize_t length = readlink(path, exe, sizeof exe - 1);
    exe[length > 0 ? length : 0] = 0;
    snprintf(path, sizeof path, "/proc/%d/maps", child);
    FILE *maps = fopen(path, "r");
    uint64_t base = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end, offset;
        char permissions[8];
        if (sscanf(line, "%lx-%lx %7s %lx", &start, &end, permissions, &offset) == 4 && offset == 0 && strstr(line, exe)) {
            base = start;
            break;
        }
    }
    fclose(maps);

    /* /proc/PID/mem writes through the text's write protection, for the tracer only. */
    snprintf(path, sizeof path, "/proc/%d/mem", child);
    int memory = open(path, O_RDWR);
    /* Entries sharing an address were merged by the sort; the same byte is never armed twice. */
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && entries[i] == entries[i - 1]) continue;
        uint8_t trap = 0xCC;
        off_t at = (off_t)(base + entries[i]);
        if (pread(memory, &original[i], 1, at) == 1 && pwrite(memory, &trap, 1, at) == 1) armed[i] = 1;
    }

    struct sigaction action = {.sa_handler = stop};
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    ptrace(PTRACE_CONT, child, 0, 0);
    while (!stopping) {
        pid_t thread = waitpid(-1, &status, __WALL);
        if (thread < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            if (thread == child) break;
            continue;
        }
        int deliver = 0;
        int signal = WSTOPSIG(status);
        if (signal == SIGTRAP && (status >> 16) == 0) {
            struct user_regs_struct registers;
            ptrace(PTRACE_GETREGS, thread, 0, &registers);
            uint64_t at = registers.rip - 1 - base;
            uint64_t *found = bsearch(&at, entries, count, sizeof *entries, compare);
            if (found) {
                /* The first entry of a run of equal addresses holds the original byte. */
                while (found > entries && found[-1] == at) found--;
                size_t i = (size_t)(found - entries);
                if (armed[i]) {
                    pwrite(memory, &original[i], 1, (off_t)(base + at));
                    armed[i] = 0;
                    printf("%lx\n", (unsigned long)at);
                }
                /* Another thread may have trapped here before the byte came back: rewind it too. */
                registers.rip -= 1;
                ptrace(PTRACE_SETREGS, thread, 0, &registers);
            } else {
                deliver = SIGTRAP;
            }
        } else if (signal != SIGTRAP && signal != SIGSTOP) {
            deliver = signal;
        }
        ptrace(PTRACE_CONT, thread, 0, deliver);
    }
    kill(child, SIGKILL);
    return 0;
}
