/* bench/images: libjpeg-turbo alone, as tjbench measures it: every JPEG of
 * the folders given read into memory first, then decoded to RGB with
 * tjDecompress2 (the accurate IDCT, one handle, one output buffer reused)
 * on one core for at least SECONDS. Prints one JSON line: images/s and
 * MB/s of JPEG bytes. The reference for towerpack's decode-only rate.
 *
 *   cmake --build build --target tjdecode   (bench/CMakeLists.txt)
 *   build/bench/tjdecode SECONDS FILE...                                   */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <turbojpeg.h>

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tjdecode SECONDS FILE...\n");
        return 2;
    }
    double secs = atof(argv[1]);
    int n = argc - 2;
    unsigned char **buf = calloc(n, sizeof *buf);
    unsigned long *len = calloc(n, sizeof *len);
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[i + 2], "rb");
        if (!f) {
            perror(argv[i + 2]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        len[i] = (unsigned long)ftell(f);
        rewind(f);
        buf[i] = malloc(len[i]);
        if (fread(buf[i], 1, len[i], f) != len[i])
            return 1;
        fclose(f);
    }
    tjhandle h = tjInitDecompress();
    unsigned char *out = malloc(4096 * 4096 * 3);
    long images = 0;
    double bytes = 0, t0 = s_now(), t = t0;
    while (t - t0 < secs) {
        for (int i = 0; i < n; i++) {
            int w, hh, sub, cs;
            if (tjDecompressHeader3(h, buf[i], len[i], &w, &hh, &sub, &cs) ||
                tjDecompress2(h, buf[i], len[i], out, w, 0, hh, TJPF_RGB, 0)) {
                fprintf(stderr, "%s: %s\n", argv[i + 2], tjGetErrorStr2(h));
                return 1;
            }
            images++;
            bytes += len[i];
        }
        t = s_now();
    }
    printf("{\"images_per_s\": %.1f, \"mb_per_s\": %.2f, \"images\": %ld}\n",
           images / (t - t0), bytes / 1e6 / (t - t0), images);
    return 0;
}
