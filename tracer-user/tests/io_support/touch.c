/* touch FILE OFFSET...: a synthetic target for page-fault attribution.
 *
 * Maps FILE read-only and shared (as llama.cpp maps a model), asks for no
 * readahead around faults (MADV_RANDOM, so each touch faults in about one
 * page and the fault-to-offset mapping stays exact), then reads one byte at
 * each OFFSET in the order given and prints `addr=0x... offset=N` for it.
 * Offsets may be decimal or 0x-hex. Exits 0, or 2 with a message on bad use.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "touch: %s %s: %s\n", what, arg, errno ? strerror(errno) : "invalid");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: touch FILE OFFSET...\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("cannot open", argv[1]);
    struct stat st;
    if (fstat(fd, &st) != 0) return fail("cannot stat", argv[1]);
    if (st.st_size == 0) {
        errno = 0;
        return fail("empty file", argv[1]);
    }
    size_t size = (size_t)st.st_size;
    const volatile unsigned char *base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return fail("cannot mmap", argv[1]);
    if (madvise((void *)base, size, MADV_RANDOM) != 0) return fail("madvise failed on", argv[1]);

    /* Parse every offset before touching any, so bad input faults nothing. */
    unsigned long long *offs = calloc((size_t)argc, sizeof *offs);
    if (!offs) return fail("out of memory for", "offsets");
    for (int i = 2; i < argc; i++) {
        char *end;
        errno = 0;
        offs[i] = strtoull(argv[i], &end, 0);
        if (errno || end == argv[i] || *end || argv[i][0] == '-') {
            errno = 0;
            return fail("bad offset", argv[i]);
        }
        if (offs[i] >= size) {
            errno = 0;
            return fail("offset beyond the end of the file:", argv[i]);
        }
    }
    unsigned sum = 0;
    for (int i = 2; i < argc; i++) {
        sum += base[offs[i]];
        printf("addr=%p offset=%llu\n", (const void *)(base + offs[i]), offs[i]);
    }
    /* Keep the reads observable. */
    if (sum == 0xFFFFFFFFu) fputs("", stderr);
    return fflush(stdout) == 0 ? 0 : 2;
}
