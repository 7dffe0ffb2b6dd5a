/* tp-bench tensorpack: tensorpack's formats against towerpack's own.
 *
 *   tp-bench tensorpack [--count N] [--rounds R] [--python PY] [--peer SCRIPT]
 *                       [--json]
 *   tp-bench tensorpack --write-lmdb PATH --spec SPEC [--format pickle|msgpack]
 *                       [--count N]
 *
 * Receive: Fashion-MNIST batches (128 x 28 x 28 uint8 images and 128 int64
 * labels, the first batches of fashion-mnist:train) pushed over ipc by a
 * sender thread (its own ZeroMQ context; each message encoded once and
 * sent zero-copy from that buffer, so the sender costs the same for every
 * format) to the remote: dataflow on this thread, which decodes each into
 * a datapoint. One round times N messages of towerpack's wire format and
 * of each tensorpack format back to back (the order alternates between
 * rounds); the ratio per format is its time over the wire format's, the
 * median over the rounds.
 *
 * Decode: the same messages decoded in a loop by tp_tpk_decode (keeping
 * the message, as the receivers do, and copying; the best of 5 runs of
 * 0.2 s of CPU time), and with --python by
 * Python's own pickle.loads / msgpack.unpackb (msgpack_numpy) on the same
 * bytes (--peer, default bench/peers/tensorpack_decode.py from the source
 * root); the ratio is Python's time
 * over towerpack's.
 *
 * --write-lmdb writes SPEC's datapoints as LMDBSerializer.save does (keys
 * '%08d', values in --format, "__keys__"): one pass, or --count of them. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/towerpack.h>
#include "tools/tp-bench/bench_median.h"

#define NFMT 4  /* towerpack wire, pickle, msgpack, zmq_ops */
static const char *const s_names[NFMT] = {"towerpack", "pickle", "msgpack", "zmq_ops"};

typedef struct {
    int nframes;
    void *frame[4];
    size_t len[4];
} s_msg_t;

typedef struct {
    const char *ep;
    const s_msg_t *msg;
    long count;
    int rc;
} s_sender_t;

static void *s_send_thread(void *arg) {
    s_sender_t *s = arg;
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_PUSH);
    int hwm = 50;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    s->rc = zmq_connect(sock, s->ep);
    for (long i = 0; i < s->count && s->rc == 0; i++)
        for (int f = 0; f < s->msg->nframes; f++) {
            zmq_msg_t m;
            /* zero-copy from the one encoded buffer: nothing to free */
            zmq_msg_init_data(&m, s->msg->frame[f], s->msg->len[f], NULL, NULL);
            if (zmq_msg_send(&m, sock, f + 1 < s->msg->nframes ? ZMQ_SNDMORE : 0) < 0) {
                zmq_msg_close(&m);
                s->rc = -1;
                break;
            }
        }
    int linger = 10000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Seconds to receive and decode `count` messages over ipc. */
static double s_receive(const s_msg_t *msg, long count, const char *ep) {
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 30;
    tp_dataflow_t *df = tp_df_remote(ep, &ro);
    if (!df || tp_dataflow_reset_state(df, 0, 0) != TP_OK)
        return -1;
    s_sender_t s = {.ep = ep, .msg = msg, .count = count};
    pthread_t th;
    pthread_create(&th, NULL, s_send_thread, &s);
    double t = -1;
    uint64_t t0 = 0;
    long got = 0;
    for (; got < count; got++) {
        tp_datapoint_t *dp = NULL;
        if (tp_dataflow_next(df, &dp) != TP_OK)
            break;
        if (got == 0)
            t0 = tp_now_ns();  /* from the first: connecting is not timed */
        tp_datapoint_destroy(&dp);
    }
    if (got == count && count > 1)
        t = (double)(tp_now_ns() - t0) * 1e-9 * (double)count / (double)(count - 1);
    pthread_join(th, NULL);
    if (tp_df_remote_malformed(df))
        t = -1;
    tp_dataflow_destroy(&df);
    return t;
}

static void s_release_none(void *data, void *hint) {
    (void)data;
    (void)hint;
}

static uint64_t s_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU nanoseconds per tp_tpk_decode of msg (keep: the message stays the
 * arrays' memory, as in the receivers): the best of 5 runs of 0.2 s of
 * this process's CPU time, as the Python peer times its side. CPU time,
 * not wall time: on a shared machine the wall clock also counts the time
 * other processes had the core, which differs between the two sides. */
static double s_decode_ns(const s_msg_t *msg, int keep) {
    double best = -1;
    for (int r = 0; r < 5; r++) {
        uint64_t n = 0, t0 = s_cpu_ns(), end = t0 + 200000000u, now;
        do {
            for (int i = 0; i < 16; i++) {
                tp_datapoint_t *dp = NULL;
                if (tp_tpk_decode(msg->frame[0], msg->len[0], NULL,
                                  keep ? s_release_none : NULL, NULL, &dp) != TP_OK)
                    return -1;
                tp_datapoint_destroy(&dp);
            }
            n += 16;
            now = s_cpu_ns();
        } while (now < end);
        double v = (double)(now - t0) / (double)n;
        if (best < 0 || v < best)
            best = v;
    }
    return best;
}

/* The first batch of 128 Fashion-MNIST images, labels as int64 (numpy's
 * default integers, what a Python DataFlow yields). */
static tp_datapoint_t *s_batch(void) {
    tp_dataflow_t *df = NULL;
    if (tp_spec_parse("fashion-mnist:train,shuffle=0 | batch 128", &df) != TP_OK ||
        tp_dataflow_reset_state(df, 0, 0) != TP_OK)
        return NULL;
    tp_datapoint_t *b = NULL;
    tp_status_t rc = tp_dataflow_next(df, &b);
    tp_dataflow_destroy(&df);
    if (rc != TP_OK)
        return NULL;
    tp_tensor_t *lab = tp_datapoint_get(b, 1);
    tp_tensor_t l64;
    if (tp_tensor_init(&l64, TP_INT64, lab->ndim, lab->shape) != TP_OK)
        return NULL;
    for (size_t i = 0; i < tp_tensor_numel(lab); i++)
        ((int64_t *)l64.data)[i] = ((int32_t *)lab->data)[i];
    tp_tensor_fini(lab);
    tp_tensor_move(lab, &l64);
    return b;
}

static int s_write_lmdb(const char *path, const char *spec, const char *fmt, long count) {
    tp_tpk_format_t f = !strcmp(fmt, "msgpack") ? TP_TPK_MSGPACK : TP_TPK_PICKLE;
    if (strcmp(fmt, "msgpack") && strcmp(fmt, "pickle")) {
        fprintf(stderr, "tp-bench tensorpack: --format pickle or msgpack\n");
        return 2;
    }
    tp_dataflow_t *df = NULL;
    if (tp_spec_parse(spec, &df) != TP_OK || tp_dataflow_reset_state(df, 0, 0) != TP_OK) {
        fprintf(stderr, "tp-bench tensorpack: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        return 1;
    }
    int64_t written = 0;
    double t0 = tp_now_s();
    tp_status_t rc = tp_tpk_lmdb_save(df, path, f, count > 0 ? count : -1, &written);
    tp_dataflow_destroy(&df);
    if (rc != TP_OK) {
        fprintf(stderr, "tp-bench tensorpack: %s\n", tp_last_error());
        return 1;
    }
    printf("tp-bench tensorpack: wrote %lld datapoints (%s) to %s in %.2f s\n",
           (long long)written, fmt, path, tp_now_s() - t0);
    return 0;
}

int tp_bench_tensorpack(int argc, char **argv) {
    long count = 2000;
    int rounds = 5, json = 0;
    const char *peer = "bench/peers/tensorpack_decode.py";
    const char *python = NULL, *lmdb = NULL, *spec = NULL, *fmt = "pickle";
    static const struct option opts[] = {
        {"count", required_argument, 0, 'n'},  {"rounds", required_argument, 0, 'r'},
        {"python", required_argument, 0, 'p'}, {"json", no_argument, 0, 'j'},
        {"write-lmdb", required_argument, 0, 'w'}, {"spec", required_argument, 0, 's'},
        {"format", required_argument, 0, 'f'}, {"peer", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'n': count = atol(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'p': python = optarg; break;
        case 'j': json = 1; break;
        case 'w': lmdb = optarg; break;
        case 's': spec = optarg; break;
        case 'f': fmt = optarg; break;
        case 'P': peer = optarg; break;
        case 'h':
            printf("usage: tp-bench tensorpack [--count N] [--rounds R] [--python PY]\n"
                   "                           [--peer SCRIPT] [--json]\n"
                   "       tp-bench tensorpack --write-lmdb PATH --spec SPEC\n"
                   "                           [--format pickle|msgpack] [--count N]\n"
                   "Receiving Fashion-MNIST batches in tensorpack's formats against\n"
                   "towerpack's wire format over ipc, and decoding them against\n"
                   "Python's pickle.loads / msgpack.unpackb (--python /usr/bin/python3);\n"
                   "or write SPEC as tensorpack's LMDBSerializer.save does.\n");
            return 0;
        default: return 2;
        }
    }
    if (lmdb) {
        if (!spec) {
            fprintf(stderr, "tp-bench tensorpack: --write-lmdb needs --spec\n");
            return 2;
        }
        return s_write_lmdb(lmdb, spec, fmt, count == 2000 ? -1 : count);
    }
    if (count < 10 || rounds < 1) {
        fprintf(stderr, "tp-bench tensorpack: --count >= 10 and --rounds >= 1\n");
        return 2;
    }
    tp_log_set_level(TP_LOG_WARN);
    tp_datapoint_t *b = s_batch();
    if (!b) {
        fprintf(stderr, "tp-bench tensorpack: no Fashion-MNIST batch: %s\n", tp_last_error());
        return 1;
    }
    s_msg_t msgs[NFMT];
    memset(msgs, 0, sizeof msgs);
    {   /* towerpack's wire format: header + one frame per component */
        tp_wire_msg_t *m = tp_wire_msg_new();
        tp_datapoint_t *copy = tp_datapoint_copy(b);
        if (tp_wire_encode(&copy, NULL, m) != TP_OK)
            return 1;
        msgs[0].nframes = tp_wire_msg_frames(m);
        for (int f = 0; f < msgs[0].nframes; f++) {
            msgs[0].len[f] = tp_wire_msg_frame_size(m, f);
            msgs[0].frame[f] = malloc(msgs[0].len[f]);
            memcpy(msgs[0].frame[f], tp_wire_msg_frame_data(m, f), msgs[0].len[f]);
        }
        tp_wire_msg_destroy(&m);
    }
    const tp_tpk_format_t tf[NFMT] = {0, TP_TPK_PICKLE, TP_TPK_MSGPACK, TP_TPK_ZMQ_OPS};
    for (int k = 1; k < NFMT; k++) {
        msgs[k].nframes = 1;
        if (tp_tpk_encode(b, tf[k], &msgs[k].frame[0], &msgs[k].len[0]) != TP_OK)
            return 1;
    }
    char dir[] = "/tmp/tp-bench-tpk-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/recv.sock", dir);
    double times[NFMT][64], ratio[NFMT][64];
    if (rounds > 64)
        rounds = 64;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < NFMT; i++) {
            int k = r % 2 ? NFMT - 1 - i : i;  /* alternate the order */
            times[k][r] = s_receive(&msgs[k], count, ep);
            if (times[k][r] <= 0) {
                fprintf(stderr, "tp-bench tensorpack: receiving %s failed: %s\n",
                        s_names[k], tp_last_error());
                return 1;
            }
        }
        for (int k = 0; k < NFMT; k++)
            ratio[k][r] = times[k][r] / times[0][r];
    }
    double med_t[NFMT], med_r[NFMT], dec_keep[NFMT], dec_copy[NFMT];
    for (int k = 0; k < NFMT; k++) {
        double t[64];
        memcpy(t, times[k], sizeof t);
        med_t[k] = tp_bench_median_mean(t, rounds);
        med_r[k] = tp_bench_median_mean(ratio[k], rounds);
        dec_keep[k] = k ? s_decode_ns(&msgs[k], 1) : 0;
        dec_copy[k] = k ? s_decode_ns(&msgs[k], 0) : 0;
    }
    /* Python's own decoders on the same bytes */
    double py_ns[NFMT] = {0};
    if (python) {
        for (int k = 1; k < NFMT; k++) {
            char p[200];
            snprintf(p, sizeof p, "%s/%s.bin", dir, s_names[k]);
            FILE *f = fopen(p, "wb");
            if (!f || fwrite(msgs[k].frame[0], 1, msgs[k].len[0], f) != msgs[k].len[0])
                return 1;
            fclose(f);
        }
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s %s %s", python, peer, dir);
        FILE *pp = popen(cmd, "r");
        char line[256];
        while (pp && fgets(line, sizeof line, pp)) {
            char name[32];
            double ns;
            if (sscanf(line, "%31s %lf", name, &ns) == 2)
                for (int k = 1; k < NFMT; k++)
                    if (!strcmp(name, s_names[k]))
                        py_ns[k] = ns;
        }
        if (!pp || pclose(pp) != 0)
            fprintf(stderr, "tp-bench tensorpack: %s failed (numpy, msgpack, "
                    "msgpack_numpy?)\n", cmd);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
    double mb = (double)tp_datapoint_nbytes(b) / 1e6;
    if (json) {
        printf("{\"bench\":\"tensorpack\",\"count\":%ld,\"rounds\":%d,\"formats\":[", count,
               rounds);
        for (int k = 0; k < NFMT; k++)
            printf("%s{\"format\":\"%s\",\"bytes\":%zu,\"receive_msgs_per_s\":%.1f,"
                   "\"receive_ratio\":%.4f,\"decode_keep_ns\":%.1f,\"decode_copy_ns\":%.1f,"
                   "\"python_ns\":%.1f}", k ? "," : "", s_names[k],
                   msgs[k].nframes == 1 ? msgs[k].len[0] : msgs[k].len[0] + msgs[k].len[1] +
                   msgs[k].len[2], count / med_t[k], med_r[k], dec_keep[k], dec_copy[k],
                   py_ns[k]);
        printf("]}\n");
    } else {
        printf("tp-bench tensorpack: %ld batches of 128 x 28 x 28 uint8 + 128 int64 "
               "(%.3f MB) over ipc, %d rounds (median)\n", count, mb, rounds);
        printf("%-10s %12s %10s %14s %14s %14s %10s\n", "format", "receive/s", "vs own",
               "decode keep", "decode copy", "Python", "Py/keep");
        for (int k = 0; k < NFMT; k++) {
            printf("%-10s %12.0f %9.3fx", s_names[k], count / med_t[k], med_r[k]);
            if (k)
                printf(" %11.2f us %11.2f us", dec_keep[k] * 1e-3, dec_copy[k] * 1e-3);
            else
                printf(" %14s %14s", "-", "-");
            if (k && py_ns[k] > 0)
                printf(" %11.2f us %9.1fx", py_ns[k] * 1e-3, py_ns[k] / dec_keep[k]);
            printf("\n");
        }
    }
    for (int k = 0; k < NFMT; k++)
        for (int f = 0; f < msgs[k].nframes; f++)
            free(msgs[k].frame[f]);
    tp_datapoint_destroy(&b);
    return 0;
}
