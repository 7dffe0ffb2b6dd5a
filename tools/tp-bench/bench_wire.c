/* tp-bench wire: cost of encoding and decoding a datapoint in the wire
 * format, next to a plain memcpy of the same bytes in the same run.
 *
 * Cases: a 1 MiB float32 batch [64,1,64,64] and a 64-byte datapoint, each
 * without and with lz4. Each case runs for --seconds and reports MB/s,
 * messages/s and the time relative to memcpy of the same payload. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/towerpack.h>

typedef struct {
    const char *name;
    size_t payload;       /* bytes of tensor data per message */
    double msgs_per_s;
    double mb_per_s;
    double ns_per_msg;
    double memcpy_ns;     /* memcpy of `payload` bytes */
    size_t wire_bytes;    /* encoded size */
} s_result_t;

/* Image-like float32 data: mostly zeros and smooth ramps, as a normalised
 * Fashion-MNIST batch is, so lz4 sees realistic redundancy. */
static tp_datapoint_t *s_batch_1mib(void) {
    int64_t shape[] = {64, 1, 64, 64};
    tp_datapoint_t *dp = tp_datapoint_new(1);
    tp_tensor_t *t = tp_datapoint_get(dp, 0);
    TP_ASSERT(tp_tensor_init(t, TP_FLOAT32, 4, shape) == TP_OK);
    float *f = t->data;
    tp_rng_t r;
    tp_rng_init(&r, 1, 0);
    for (size_t i = 0; i < tp_tensor_numel(t); i++) {
        size_t x = i % 64, y = (i / 64) % 64;
        int inside = x > 12 && x < 52 && y > 6 && y < 58;
        f[i] = inside ? (float)(tp_rng_below(&r, 256)) / 255.0f : 0.0f;
    }
    return dp;
}

static tp_datapoint_t *s_small(void) {
    int64_t shape[] = {14};
    tp_datapoint_t *dp = tp_datapoint_new(2);
    TP_ASSERT(tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape) == TP_OK);
    TP_ASSERT(tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT64, 0, NULL) == TP_OK);
    *(int64_t *)tp_datapoint_get(dp, 1)->data = 7;
    return dp;
}

static double s_memcpy_ns(size_t bytes, double seconds) {
    char *src = tp_alloc(bytes), *dst = tp_alloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    uint64_t n = 0, t0 = tp_now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
    uint64_t now;
    do {
        for (int i = 0; i < 64; i++) {
            memcpy(dst, src, bytes);
            __asm__ volatile("" : : "r"(dst) : "memory");
        }
        n += 64;
    } while ((now = tp_now_ns()) < deadline);
    tp_free(src);
    tp_free(dst);
    return (double)(now - t0) / (double)n;
}

/* Encode+decode a copy of `proto` repeatedly. The copy is made outside the
 * timed region (encode takes ownership), so only the wire cost is timed. */
static int s_run(s_result_t *res, tp_datapoint_t *proto, int lz4,
                 double seconds) {
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.lz4 = lz4;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    uint64_t n = 0, timed = 0;
    uint64_t deadline = tp_now_ns() + (uint64_t)(seconds * 1e9);
    res->payload = tp_datapoint_nbytes(proto);
    while (tp_now_ns() < deadline) {
        tp_datapoint_t *dp = tp_datapoint_copy(proto), *back = NULL;
        uint64_t t0 = tp_now_ns();
        if (tp_wire_encode(&dp, &o, msg) != TP_OK)
            goto fail;
        res->wire_bytes = tp_wire_msg_bytes(msg);
        if (tp_wire_decode(msg, &o, &back) != TP_OK)
            goto fail;
        tp_datapoint_destroy(&back);
        timed += tp_now_ns() - t0;
        n++;
    }
    tp_wire_msg_destroy(&msg);
    res->ns_per_msg = (double)timed / (double)n;
    res->msgs_per_s = 1e9 / res->ns_per_msg;
    res->mb_per_s = res->msgs_per_s * (double)res->payload / 1e6;
    return 0;
fail:
    fprintf(stderr, "tp-bench wire: %s\n", tp_last_error());
    tp_wire_msg_destroy(&msg);
    return 1;
}

static void s_usage(FILE *out) {
    fprintf(out,
            "usage: tp-bench wire [--seconds S] [--json]\n"
            "  encode+decode of a 1 MiB float32 batch and a 64-byte datapoint,\n"
            "  with and without lz4, next to memcpy of the same bytes.\n"
            "  --seconds S  time per case (default 1.0)\n"
            "  --json       one JSON object on stdout\n");
}

int tp_bench_wire(int argc, char **argv) {
    double seconds = 1.0;
    int json = 0;
    static const struct option opts[] = {{"seconds", required_argument, 0, 's'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': {
            char *end;
            seconds = strtod(optarg, &end);
            if (*end || seconds <= 0) {
                fprintf(stderr, "tp-bench wire: --seconds needs a positive "
                                "number, got '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'j': json = 1; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tp-bench wire: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    tp_datapoint_t *big = s_batch_1mib(), *small = s_small();
    s_result_t res[4] = {{.name = "1MiB"}, {.name = "1MiB_lz4"},
                         {.name = "64B"}, {.name = "64B_lz4"}};
    int rc = s_run(&res[0], big, 0, seconds) || s_run(&res[1], big, 1, seconds) ||
             s_run(&res[2], small, 0, seconds) || s_run(&res[3], small, 1, seconds);
    if (!rc) {
        double big_cp = s_memcpy_ns(res[0].payload, seconds);
        double small_cp = s_memcpy_ns(res[2].payload, seconds);
        for (int i = 0; i < 4; i++)
            res[i].memcpy_ns = i < 2 ? big_cp : small_cp;
    }
    tp_datapoint_destroy(&big);
    tp_datapoint_destroy(&small);
    if (rc)
        return 1;
    if (json) {
        printf("{\"bench\":\"wire\",\"seconds_per_case\":%g,\"cases\":[", seconds);
        for (int i = 0; i < 4; i++)
            printf("%s{\"name\":\"%s\",\"payload_bytes\":%zu,\"wire_bytes\":%zu,"
                   "\"msgs_per_s\":%.1f,\"mb_per_s\":%.1f,\"ns_per_msg\":%.1f,"
                   "\"memcpy_ns\":%.1f,\"ratio_to_memcpy\":%.4f}",
                   i ? "," : "", res[i].name, res[i].payload, res[i].wire_bytes,
                   res[i].msgs_per_s, res[i].mb_per_s, res[i].ns_per_msg,
                   res[i].memcpy_ns, res[i].ns_per_msg / res[i].memcpy_ns);
        printf("]}\n");
    } else {
        printf("%-10s %10s %10s %14s %12s %12s %12s\n", "case", "payload",
               "wire", "msgs/s", "MB/s", "ns/msg", "x memcpy");
        for (int i = 0; i < 4; i++)
            printf("%-10s %10zu %10zu %14.0f %12.1f %12.1f %12.3f\n",
                   res[i].name, res[i].payload, res[i].wire_bytes,
                   res[i].msgs_per_s, res[i].mb_per_s, res[i].ns_per_msg,
                   res[i].ns_per_msg / res[i].memcpy_ns);
        printf("memcpy: 1 MiB %.0f ns, 64 B %.1f ns\n", res[0].memcpy_ns,
               res[2].memcpy_ns);
    }
    return 0;
}
