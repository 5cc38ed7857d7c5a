/* burst READY GO DONE FILE: a target whose events come faster than a
 * stopped ttrace drains them. Creates READY, waits until GO exists, then
 * faults fresh anonymous pages (8 x 16 MiB, no huge pages: one fault per
 * page) and reads FILE cold through the page cache (page-cache fills and
 * block requests), creates DONE and exits. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static void create(const char *path) {
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: burst READY GO DONE FILE\n");
        return 2;
    }
    create(argv[1]);
    while (access(argv[2], F_OK) != 0)
        usleep(1000);

    const size_t len = 16 << 20;
    const long page = sysconf(_SC_PAGESIZE);
    for (int round = 0; round < 8; round++) {
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        madvise(p, len, MADV_NOHUGEPAGE);
        for (size_t off = 0; off < len; off += page)
            ((volatile char *)p)[off] = 1;
        munmap(p, len);
    }

    int fd = open(argv[4], O_RDONLY);
    if (fd < 0) {
        perror(argv[4]);
        return 1;
    }
    /* Clean pages only can be dropped: write back first. */
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    static char buf[1 << 16];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
    create(argv[3]);
    return 0;
}
