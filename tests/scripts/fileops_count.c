/* Counts the file communicator's file operations: LD_PRELOAD'ed into a job, it counts
 * successful openat() calls on names relative to a directory descriptor that end in
 * ".rec" or ".all" (the communicator's round records, and their temporary files) or
 * contain ".tmp-": file_counts(out[3]) gives the opens for reading and the creates
 * (O_CREAT), then the opens for reading of method 2's published files (names ending in
 * ".json": records and meta files, or ".token"). Built by tests/test_scale_counts.py
 * with the system C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>

static long long n_opens, n_creates, n_published;

void file_counts(long long out[3]) {
    out[0] = n_opens;
    out[1] = n_creates;
    out[2] = n_published;
}

static int ends_with(const char *name, const char *tail) {
    size_t n = strlen(name), t = strlen(tail);
    return n > t && strcmp(name + n - t, tail) == 0;
}

static int is_round_file(const char *name) {
    size_t n = strlen(name);
    if (name[0] == '/') return 0;
    if (strstr(name, ".tmp-")) return 1;
    return n > 4 && (strcmp(name + n - 4, ".rec") == 0 || strcmp(name + n - 4, ".all") == 0 ||
                     strcmp(name + n - 4, ".arr") == 0 || strcmp(name + n - 4, ".rel") == 0);
}

static int counted(int fd, const char *name, int flags) {
    if (fd >= 0 && name[0] != '/' && !(flags & O_CREAT) && !strstr(name, ".tmp-") &&
        (ends_with(name, ".json") || ends_with(name, ".token")))
        n_published++;
    if (fd >= 0 && is_round_file(name)) {
        if (flags & O_CREAT) n_creates++;
        else n_opens++;
    }
    return fd;
}

typedef int (*openat_fn)(int, const char *, int, ...);

#define WRAP(sym)                                                         \
    int sym(int dirfd, const char *name, int flags, ...) {                \
        static openat_fn real;                                            \
        mode_t mode = 0;                                                  \
        if (flags & (O_CREAT | O_TMPFILE)) {                              \
            va_list ap;                                                   \
            va_start(ap, flags);                                          \
            mode = va_arg(ap, mode_t);                                    \
            va_end(ap);                                                   \
        }                                                                 \
        if (!real) real = (openat_fn)dlsym(RTLD_NEXT, #sym);              \
        return counted(real(dirfd, name, flags, mode), name, flags);      \
    }

WRAP(openat)
WRAP(openat64)
