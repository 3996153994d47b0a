/* A C program using libxio as "IBP Deployment Tests and Integration with DiDaS Project" §6 describes: local paths and
 * lors:// exNodes through the same calls. Run by the test suite
 * (crates/cli/tests/it/xio.rs) with depots from ~/.xndrc in a temporary
 * HOME; argv[1] is a scratch directory. Prints "xio_test: ok" on success. */
#include <xio.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "xio_test: %s:%d: %s failed (errno %d: %s)\n",   \
                    __FILE__, __LINE__, #cond, errno, strerror(errno));      \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static unsigned char byte_at(long i) { return (unsigned char)(i * 31 + 7); }

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char uri[4096], local[4096], missing[4096];
    snprintf(uri, sizeof uri, "lors:///%s/c.xnd", argv[1]);
    snprintf(local, sizeof local, "%s/local.bin", argv[1]);
    snprintf(missing, sizeof missing, "lors:///%s/none.xnd", argv[1]);
    const long size = 3 * 1024 * 1024 + 333;

    /* Write 3 MiB in 1000-byte calls: stored as whole blocks. */
    int fd = xio_open(uri, O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(fd >= 0);
    unsigned char buf[65536];
    for (long off = 0; off < size; off += 1000) {
        long n = size - off < 1000 ? size - off : 1000;
        for (long i = 0; i < n; i++) buf[i] = byte_at(off + i);
        CHECK(xio_write(fd, buf, (size_t)n) == n);
    }
    struct stat st;
    CHECK(xio_fstat(fd, &st) == 0);
    CHECK(st.st_size == size);
    CHECK(S_ISREG(st.st_mode));
    CHECK(xio_close(fd) == 0);
    CHECK(xio_stat(uri, &st) == 0 && st.st_size == size);
    CHECK(xio_lstat(uri, &st) == 0 && st.st_size == size);

    /* Read it back in 4 KiB reads. */
    fd = xio_open(uri, O_RDONLY);
    CHECK(fd >= 0);
    long total = 0;
    for (;;) {
        ssize_t n = xio_read(fd, buf, 4096);
        CHECK(n >= 0);
        if (n == 0) break;
        for (ssize_t i = 0; i < n; i++) CHECK(buf[i] == byte_at(total + i));
        total += n;
    }
    CHECK(total == size);
    /* Seek and read; writing a read-only descriptor is EBADF. */
    CHECK(xio_lseek(fd, -10, SEEK_END) == size - 10);
    CHECK(xio_read(fd, buf, 100) == 10);
    CHECK(buf[0] == byte_at(size - 10));
    errno = 0;
    CHECK(xio_write(fd, buf, 1) == -1 && errno == EBADF);
    CHECK(xio_close(fd) == 0);

    /* O_RDWR: overwrite in the middle, truncate, read back. */
    fd = xio_open(uri, O_RDWR);
    CHECK(fd >= 0);
    CHECK(xio_lseek(fd, 1048570, SEEK_SET) == 1048570);
    CHECK(xio_write(fd, "0123456789", 10) == 10);
    CHECK(xio_lseek(fd, 1048565, SEEK_SET) == 1048565);
    CHECK(xio_read(fd, buf, 20) == 20);
    CHECK(memcmp(buf + 5, "0123456789", 10) == 0);
    CHECK(buf[0] == byte_at(1048565) && buf[19] == byte_at(1048584));
    CHECK(xio_ftruncate(fd, 2000000) == 0);
    CHECK(xio_fstat(fd, &st) == 0 && st.st_size == 2000000);
    CHECK(xio_close(fd) == 0);
    CHECK(xio_stat(uri, &st) == 0 && st.st_size == 2000000);

    /* O_APPEND adds at the end. */
    fd = xio_open(uri, O_WRONLY | O_APPEND);
    CHECK(fd >= 0);
    CHECK(xio_write(fd, "end", 3) == 3);
    CHECK(xio_close(fd) == 0);
    fd = xio_open(uri, O_RDONLY);
    CHECK(xio_lseek(fd, -3, SEEK_END) == 2000000);
    CHECK(xio_read(fd, buf, 3) == 3 && memcmp(buf, "end", 3) == 0);
    CHECK(xio_close(fd) == 0);

    /* Errors set errno. */
    errno = 0;
    CHECK(xio_open(missing, O_RDONLY) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(xio_stat(missing, &st) == -1 && errno == ENOENT);

    /* Local paths go to the operating system. */
    fd = xio_open(local, O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(fd >= 0);
    CHECK(xio_write(fd, "local", 5) == 5);
    CHECK(xio_close(fd) == 0);
    CHECK(xio_stat(local, &st) == 0 && st.st_size == 5);
    fd = xio_open(local, O_RDONLY);
    CHECK(xio_read(fd, buf, 10) == 5 && memcmp(buf, "local", 5) == 0);
    CHECK(xio_lseek(fd, 1, SEEK_SET) == 1);
    CHECK(xio_close(fd) == 0);

    printf("xio_test: ok\n");
    return 0;
}
