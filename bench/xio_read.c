/* Reads a file through libxio as an application would, and reports JSON.
 *
 *   xio_read PATH SIZE                  sequential reads of SIZE bytes to EOF:
 *                                       {"bytes":…,"seconds":…}
 *   xio_read PATH SIZE RATE BUFFER      a player: reads SIZE at a time into a
 *                                       buffer of BUFFER bytes, starts playing
 *                                       once it is full (or at EOF), then plays
 *                                       RATE bytes/s; a stall is the player
 *                                       finding its buffer empty:
 *                                       {"bytes","seconds","startup","stalls",
 *                                       "stall_seconds","first_stall"} (seconds
 *                                       into playback; -1 without a stall)
 *
 * PATH is a lors:// URI (IBP through libxio), a local path (a FUSE mount:
 * libxio passes it to the OS) or "-" (standard input, e.g. a pipe from
 * `lors download -o -`). Built by bench/xio.py with gcc against libxio.so. */
#include <xio.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_until(double t) {
    double d = t - now();
    if (d <= 0) return;
    struct timespec s = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&s, NULL);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: xio_read PATH SIZE [RATE BUFFER]\n");
        return 2;
    }
    double t0 = now();
    size_t size = strtoul(argv[2], NULL, 0);
    int fd = strcmp(argv[1], "-") == 0 ? 0 : xio_open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    /* Page-aligned, as cp, cat and dd read. On the bench machine's CPU
     * the kernel's copy into a buffer 16 bytes off a page boundary (what
     * malloc gives a large buffer) is slow whatever the file system:
     * 1 MiB reads of a tmpfs file ran at 1949 MiB/s into such a buffer and
     * 6051 MiB/s into an aligned one, which would measure the CPU, not the
     * file system. */
    char *buf;
    if (posix_memalign((void **)&buf, 4096, size) != 0) {
        perror("posix_memalign");
        return 1;
    }
    long long have = 0;
    if (argc == 3) {
        for (;;) {
            ssize_t n = xio_read(fd, buf, size);
            if (n < 0) {
                perror("xio_read");
                return 1;
            }
            if (n == 0) break;
            have += n;
        }
        printf("{\"bytes\":%lld,\"seconds\":%.6f}\n", have, now() - t0);
        return 0;
    }
    double rate = strtod(argv[3], NULL);
    long long cap = strtoll(argv[4], NULL, 0);
    int eof = 0;
    /* Fill the start-up buffer. */
    while (have < cap) {
        ssize_t n = xio_read(fd, buf, size);
        if (n < 0) { perror("xio_read"); return 1; }
        if (n == 0) { eof = 1; break; }
        have += n;
    }
    double start = now(), stalled = 0, first_stall = -1;
    int stalls = 0;
    /* Playback position at time t: rate x (t - start - stalled). */
    while (!eof) {
        double pos = rate * (now() - start - stalled);
        if ((double)have - pos >= (double)cap) {
            /* Buffer full: wait for room for one more read. */
            sleep_until(start + stalled + ((double)(have - cap) + (double)size) / rate);
            continue;
        }
        ssize_t n = xio_read(fd, buf, size);
        if (n < 0) { perror("xio_read"); return 1; }
        if (n == 0) { eof = 1; break; }
        double after = rate * (now() - start - stalled);
        if (after > (double)have) {
            /* The player ran dry while this read was outstanding. */
            double dry = (after - (double)have) / rate;
            stalled += dry;
            if (dry > 0.02) {
                if (stalls++ == 0) first_stall = now() - start;
            }
        }
        have += n;
    }
    double end = now();
    printf("{\"bytes\":%lld,\"seconds\":%.6f,\"startup\":%.6f,\"stalls\":%d,\"stall_seconds\":%.6f,"
           "\"first_stall\":%.6f}\n",
           have, end - t0, start - t0, stalls, stalled, first_stall);
    return 0;
}
