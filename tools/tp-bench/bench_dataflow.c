/* tp-bench dataflow: the speed of a dataflow pipeline (tensorpack's
 * TestDataSpeed), optionally against a plain C loop in the same run.
 *
 *   tp-bench dataflow SPEC [--count N] [--seconds S] [--seed S] [--json]
 *                          [--warmup N] [--reference[=shuffled]]
 *   tp-bench dataflow SPEC --save PATH [--no-lz4] [--chunk K]
 *                                             (write a record file)
 *
 * Without --count it iterates whole passes until at least --seconds (1.0)
 * have gone by. A datapoint whose components all have ndim >= 1 and share
 * their first dimension counts as that many samples (a batch); any other
 * counts as one. --reference also times the plain loop: Fashion-MNIST train
 * decoded into two arrays, memcpy'd into one preallocated 128-sample batch
 * (images and labels) over and over, for as long; the ratio is the
 * pipeline's samples/s over the loop's. --reference=shuffled reads the rows
 * in a random order, the fair reference for a shuffling source. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

static void s_usage(FILE *f) {
    fprintf(f,
            "usage: tp-bench dataflow SPEC [--count N] [--seconds S] "
            "[--seed S] [--json] [--warmup N]\n"
            "                         [--reference[=sequential|shuffled]]\n"
            "       tp-bench dataflow SPEC --save PATH [--no-lz4] [--chunk K]\n"
            "  SPEC        a pipeline, e.g. 'fashion-mnist:train | batch 128'\n"
            "  --count N   datapoints to time (default: whole passes for "
            "--seconds)\n"
            "  --seconds S least time to run without --count (default 1.0)\n"
            "  --seed S    reset_state seed (default 1)\n"
            "  --warmup N  datapoints drawn before the clock starts (default 0:\n"
            "              worker start-up and first reads are timed)\n"
            "  --json      one JSON object on stdout\n"
            "  --save PATH write one pass of SPEC to the LMDB record file "
            "PATH and exit\n"
            "  --no-lz4    with --save: store components uncompressed\n"
            "  --chunk K   with --save: datapoints per LMDB value (64; 1 is "
            "one per key)\n"
            "  --reference[=sequential|shuffled]\n"
            "              also time a plain memcpy loop over decoded "
            "Fashion-MNIST\n"
            "              (batches of 128, rows in order or in a random "
            "order) and print the ratio\n");
}

static int64_t s_samples(const tp_datapoint_t *dp) {
    int n = tp_datapoint_size(dp);
    if (n < 1)
        return 1;
    int64_t lead = -1;
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        if (t->ndim < 1)
            return 1;
        if (lead >= 0 && t->shape[0] != lead)
            return 1;
        lead = t->shape[0];
    }
    return n >= 2 || lead > 0 ? lead : 1;
}

typedef struct {
    double seconds;
    int64_t samples;
    double bytes;
} ref_result_t;

/* The plain loop: the same decoded arrays into 128-sample batches. */
static int s_reference(double min_seconds, int shuffled, ref_result_t *r) {
    char img[4096], lab[4096];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz",
             tp_df_fashion_mnist_dir());
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz",
             tp_df_fashion_mnist_dir());
    tp_tensor_t images, labels8;
    if (tp_idx_read(img, &images) != TP_OK)
        return -1;
    if (tp_idx_read(lab, &labels8) != TP_OK) {
        tp_tensor_fini(&images);
        return -1;
    }
    size_t n = (size_t)images.shape[0], sb = images.nbytes / n;
    int32_t *labels = malloc(n * sizeof *labels);
    const int B = 128;
    uint8_t *bimg = tp_alloc((size_t)B * sb);
    int32_t *blab = tp_alloc((size_t)B * 4);
    for (size_t i = 0; i < n; i++)
        labels[i] = ((const uint8_t *)labels8.data)[i];
    /* The order the samples are read in: 0..n-1, or a fixed permutation. */
    uint32_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    if (shuffled) {
        tp_rng_t rng;
        tp_rng_init(&rng, 12345, 0);
        tp_rng_shuffle_u32(&rng, order, n);
    }
    volatile uint8_t sink = 0;
    int64_t samples = 0;
    double t0 = tp_now_s(), el = 0;
    do {
        for (size_t b = 0; b + B <= n; b += B) {
            for (int j = 0; j < B; j++) {
                size_t k = order[b + j];
                memcpy(bimg + (size_t)j * sb,
                       (const uint8_t *)images.data + k * sb, sb);
                blab[j] = labels[k];
            }
            sink ^= bimg[(b / B) % ((size_t)B * sb)] ^ (uint8_t)blab[B - 1];
            samples += B;
        }
        el = tp_now_s() - t0;
    } while (el < min_seconds);
    (void)sink;
    r->seconds = el;
    r->samples = samples;
    r->bytes = (double)samples * (double)(sb + 4);
    tp_free(bimg);
    tp_free(blab);
    free(labels);
    free(order);
    tp_tensor_fini(&images);
    tp_tensor_fini(&labels8);
    return 0;
}

int tp_bench_dataflow(int argc, char **argv) {
    const char *spec = NULL;
    int64_t count = -1, warmup = 0;
    double min_seconds = 1.0;
    uint64_t seed = 1;
    int json = 0, reference = 0, nolz4 = 0;
    long chunk = 64;
    const char *save = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--save") && i + 1 < argc) {
            save = argv[++i];
        } else if (!strcmp(a, "--chunk") && i + 1 < argc) {
            char *end;
            chunk = strtol(argv[++i], &end, 10);
            if (*end || chunk < 1) {
                fprintf(stderr, "tp-bench dataflow: bad --chunk '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--no-lz4")) {
            nolz4 = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--reference") ||
                   !strcmp(a, "--reference=sequential")) {
            reference = 1;
        } else if (!strcmp(a, "--reference=shuffled")) {
            reference = 2;
        } else if ((!strcmp(a, "--count") || !strcmp(a, "--seconds") ||
                    !strcmp(a, "--seed") || !strcmp(a, "--warmup")) &&
                   i + 1 < argc) {
            const char *v = argv[++i];
            char *end;
            if (!strcmp(a, "--seconds")) {
                min_seconds = strtod(v, &end);
                if (*end || !(min_seconds >= 0)) {
                    fprintf(stderr, "tp-bench dataflow: bad --seconds '%s'\n",
                            v);
                    return 2;
                }
            } else {
                long long x = strtoll(v, &end, 10);
                if (*end || x < 1) {
                    fprintf(stderr, "tp-bench dataflow: bad %s '%s'\n", a, v);
                    return 2;
                }
                if (!strcmp(a, "--count"))
                    count = x;
                else if (!strcmp(a, "--warmup"))
                    warmup = x;
                else
                    seed = (uint64_t)x;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "tp-bench dataflow: unknown or incomplete option "
                    "'%s'\n", a);
            s_usage(stderr);
            return 2;
        } else if (!spec) {
            spec = a;
        } else {
            fprintf(stderr, "tp-bench dataflow: a second SPEC '%s' (quote the "
                    "spec)\n", a);
            return 2;
        }
    }
    if (!spec) {
        s_usage(stderr);
        return 2;
    }
    tp_dataflow_t *df = NULL;
    if (tp_spec_parse(spec, &df) != TP_OK) {
        fprintf(stderr, "tp-bench dataflow: %s\n", tp_last_error());
        return 1;
    }
    if (tp_dataflow_reset_state(df, seed, 0) != TP_OK) {
        fprintf(stderr, "tp-bench dataflow: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        return 1;
    }
    if (save) {
        /* Write one pass to an LMDB record file instead of timing. */
        tp_records_opts_t opts;
        tp_records_opts_init(&opts);
        opts.lz4 = !nolz4;
        opts.chunk = (size_t)chunk;
        int64_t n = 0;
        double t = tp_now_s();
        tp_status_t st = tp_records_save(df, save, &opts, &n);
        tp_dataflow_destroy(&df);
        if (st != TP_OK) {
            fprintf(stderr, "tp-bench dataflow: %s\n", tp_last_error());
            return 1;
        }
        printf("saved %lld datapoints to %s in %.2f s\n", (long long)n, save,
               tp_now_s() - t);
        return 0;
    }
    /* Progress on stderr (not with --json): rewritten in place twice a
     * second on a terminal, one line a second otherwise. */
    int tty = isatty(2) && !json, progress = !json;
    int64_t size = tp_dataflow_size(df);
    /* Warm-up: worker processes started, caches and buffers filled, so the
     * clock sees the steady state (as a peer measured after warm-up). */
    for (int64_t w = 0, empty = 0; w < warmup; w++) {
        tp_datapoint_t *dp;
        tp_status_t st = tp_dataflow_next(df, &dp);
        if (st == TP_DONE && ++empty < 3)
            continue;  /* a pass ended: the next one starts */
        if (st == TP_DONE) {
            fprintf(stderr, "tp-bench dataflow: the pipeline yields nothing\n");
            tp_dataflow_destroy(&df);
            return 1;
        }
        empty = 0;
        if (st < 0) {
            fprintf(stderr, "tp-bench dataflow: warm-up: %s\n", tp_last_error());
            tp_dataflow_destroy(&df);
            return 1;
        }
        tp_datapoint_destroy(&dp);
    }
    int64_t dps = 0, samples = 0, passes = 0;
    double bytes = 0;
    double t0 = tp_now_s(), last = t0, el = 0;
    int rc = 0;
    for (;;) {
        if (count >= 0 && dps >= count)
            break;
        tp_datapoint_t *dp;
        tp_status_t st = tp_dataflow_next(df, &dp);
        if (st == TP_DONE) {
            passes++;
            el = tp_now_s() - t0;
            if (count < 0 && el >= min_seconds)
                break;
            if (dps == 0 && passes > 1) {
                fprintf(stderr, "tp-bench dataflow: the pipeline yields "
                        "nothing\n");
                rc = 1;
                break;
            }
            continue;
        }
        if (st < 0) {
            fprintf(stderr, "tp-bench dataflow: %s\n", tp_last_error());
            rc = 1;
            break;
        }
        dps++;
        samples += s_samples(dp);
        bytes += (double)tp_datapoint_nbytes(dp);
        tp_datapoint_destroy(&dp);
        if (count < 0 && size < 0 && dps >= 5000 &&
            tp_now_s() - t0 >= min_seconds)
            break;  /* unknown size: no pass end to wait for */
        if (progress && (dps & 255) == 0) {
            double now = tp_now_s();
            if (now - last >= (tty ? 0.5 : 1.0)) {
                last = now;
                fprintf(stderr, "%s  %lld datapoints, %.0f datapoints/s%s",
                        tty ? "\r" : "", (long long)dps, dps / (now - t0),
                        tty ? "   " : "\n");
            }
        }
    }
    el = tp_now_s() - t0;
    tp_dataflow_destroy(&df);
    if (tty)
        fprintf(stderr, "\r%60s\r", "");
    if (rc)
        return rc;
    double dps_s = el > 0 ? dps / el : 0, sps = el > 0 ? samples / el : 0;
    double mbs = el > 0 ? bytes / el / 1e6 : 0;
    ref_result_t ref = {0, 0, 0};
    double ref_sps = 0, ratio = 0;
    if (reference) {
        if (s_reference(el > min_seconds ? el : min_seconds, reference == 2,
                        &ref) != 0) {
            fprintf(stderr, "tp-bench dataflow: reference: %s\n",
                    tp_last_error());
            return 1;
        }
        ref_sps = ref.samples / ref.seconds;
        ratio = ref_sps > 0 ? sps / ref_sps : 0;
    }
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "spec", json_string(spec));
        json_object_set_new(o, "datapoints", json_integer(dps));
        json_object_set_new(o, "samples", json_integer(samples));
        json_object_set_new(o, "passes", json_integer(passes));
        json_object_set_new(o, "bytes", json_real(bytes));
        json_object_set_new(o, "seconds", json_real(el));
        json_object_set_new(o, "datapoints_per_s", json_real(dps_s));
        json_object_set_new(o, "samples_per_s", json_real(sps));
        json_object_set_new(o, "mb_per_s", json_real(mbs));
        if (reference) {
            json_object_set_new(o, "reference_samples_per_s",
                                json_real(ref_sps));
            json_object_set_new(o, "reference_mb_per_s",
                                json_real(ref.bytes / ref.seconds / 1e6));
            json_object_set_new(o, "ratio", json_real(ratio));
            json_object_set_new(o, "reference_order",
                                json_string(reference == 2 ? "shuffled"
                                                           : "sequential"));
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(o);
    } else {
        printf("dataflow: %s\n", spec);
        printf("  %lld datapoints (%lld samples, %.1f MB) in %.3f s: "
               "%.0f datapoints/s, %.0f samples/s, %.1f MB/s\n",
               (long long)dps, (long long)samples, bytes / 1e6, el, dps_s, sps,
               mbs);
        if (reference)
            printf("  plain loop (%s rows memcpy'd into 128-sample batches): "
                   "%.0f samples/s, %.1f MB/s; ratio %.2f\n",
                   reference == 2 ? "shuffled" : "sequential", ref_sps, ref.bytes / ref.seconds / 1e6, ratio);
    }
    return 0;
}
