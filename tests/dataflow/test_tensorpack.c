/* towerpack tests: tensorpack's message formats without Python: what
 * towerpack writes it reads back (pickle, msgpack, zmq_ops), zero copy and
 * its release, int64 labels as int32, hostile messages refused by name,
 * and the remote: receiver dropping and counting them while it goes on.
 * (Python's own pickles and msgpacks: test_proc_tensorpack.c.) */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <zmq.h>
#include "dataflow/df_tp.h"  /* both msgpack decoders, white-box */
#include "dataflow/tpk_testutil.h"

static tp_datapoint_t *sample_dp(void) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    const tp_dtype_t dts[] = {TP_UINT8, TP_INT32, TP_INT64, TP_FLOAT16, TP_FLOAT32,
                              TP_FLOAT64};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        tp_tensor_t t;
        int64_t shape[3] = {2, 3, (int64_t)d + 1};
        cr_assert_eq(tp_tensor_init(&t, dts[d], 3, shape), TP_OK);
        uint8_t *p = t.data;
        for (size_t i = 0; i < t.nbytes; i++)
            p[i] = (uint8_t)(i * 7 + d);
        cr_assert_eq(tp_datapoint_append(dp, &t), TP_OK);
    }
    tp_tensor_t big, sc;
    int64_t bs[3] = {16, 28, 28};
    cr_assert_eq(tp_tensor_init(&big, TP_UINT8, 3, bs), TP_OK);
    memset(big.data, 0x5a, big.nbytes);
    cr_assert_eq(tp_datapoint_append(dp, &big), TP_OK);
    cr_assert_eq(tp_tensor_init(&sc, TP_INT64, 0, NULL), TP_OK);
    *(int64_t *)sc.data = -1234567890123LL;
    cr_assert_eq(tp_datapoint_append(dp, &sc), TP_OK);
    return dp;
}

static void roundtrip(tp_tpk_format_t fmt) {
    tp_datapoint_t *dp = sample_dp();
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, fmt, &buf, &len), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_tpk_sniff(buf, len), fmt, "sniffed %s",
                 tp_tpk_format_name(tp_tpk_sniff(buf, len)));
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_tpk_decode(buf, len, NULL, NULL, NULL, &back), TP_OK, "%s",
                 tp_last_error());
    cr_assert(tp_datapoint_equal(dp, back), "%s: decoded datapoint differs",
              tp_tpk_format_name(fmt));
    tp_datapoint_destroy(&back);
    tp_datapoint_destroy(&dp);
    free(buf);
}

Test(tensorpack, pickle_roundtrip) { roundtrip(TP_TPK_PICKLE); }

/* An empty component (no data, ndim 0) travels as shape [0], as in the
 * wire format: numpy cannot make a 0-d array of no bytes. */
Test(tensorpack, an_empty_component_travels_as_shape_0) {
    const tp_tpk_format_t f[] = {TP_TPK_PICKLE, TP_TPK_MSGPACK, TP_TPK_ZMQ_OPS};
    for (int k = 0; k < 3; k++) {
        tp_datapoint_t *dp = tp_datapoint_new(1);  /* its component is empty */
        void *buf;
        size_t len;
        cr_assert_eq(tp_tpk_encode(dp, f[k], &buf, &len), TP_OK);
        tp_datapoint_t *back = NULL;
        cr_assert_eq(tp_tpk_decode(buf, len, NULL, NULL, NULL, &back), TP_OK, "%s",
                     tp_last_error());
        const tp_tensor_t *t = tp_datapoint_cget(back, 0);
        cr_assert(t->ndim == 1 && t->shape[0] == 0 && t->nbytes == 0,
                  "%s: ndim %d", tp_tpk_format_name(f[k]), t->ndim);
        tp_datapoint_destroy(&back);
        tp_datapoint_destroy(&dp);
        free(buf);
    }
}
Test(tensorpack, msgpack_roundtrip) { roundtrip(TP_TPK_MSGPACK); }
Test(tensorpack, zmq_ops_roundtrip) { roundtrip(TP_TPK_ZMQ_OPS); }

static atomic_int g_released;
static void count_release(void *data, void *hint) {
    (void)hint;
    free(data);
    atomic_fetch_add(&g_released, 1);
}

Test(tensorpack, large_arrays_keep_the_message_until_the_last_is_freed) {
    tp_datapoint_t *dp = sample_dp();
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_ZMQ_OPS, &buf, &len), TP_OK);
    atomic_store(&g_released, 0);
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_tpk_decode(buf, len, NULL, count_release, NULL, &back), TP_OK);
    const tp_tensor_t *big = tp_datapoint_cget(back, 6);
    cr_assert(big->data >= buf && (uint8_t *)big->data < (uint8_t *)buf + len,
              "the 12 KB array was copied, not kept in the message");
    cr_assert_eq(atomic_load(&g_released), 0, "released while an array uses it");
    cr_assert(tp_datapoint_equal(dp, back));
    tp_datapoint_destroy(&back);
    cr_assert_eq(atomic_load(&g_released), 1);
    /* failure releases too */
    void *junk = malloc(4);
    memcpy(junk, "\x80\x04\xff.", 4);
    cr_assert_eq(tp_tpk_decode(junk, 4, NULL, count_release, NULL, &back), TP_ERR_PROTOCOL);
    cr_assert_eq(atomic_load(&g_released), 2);
    tp_datapoint_destroy(&dp);
}

static void *destroy_thread(void *arg) {
    tp_datapoint_t *dp = arg;
    tp_datapoint_destroy(&dp);
    return NULL;
}

/* Datapoints sharing one message, freed on two other threads at once (as
 * ZMQInput's batches are given back): the message is released once, after
 * both. */
Test(tensorpack, a_kept_message_is_released_once_by_whichever_thread_is_last) {
    tp_datapoint_t *dp = tp_datapoint_new(2);
    int64_t n = 4096, m = 1024;
    cr_assert_eq(tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_UINT8, 1, &n), TP_OK);
    cr_assert_eq(tp_tensor_init_zero(tp_datapoint_get(dp, 1), TP_FLOAT32, 1, &m), TP_OK);
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_ZMQ_OPS, &buf, &len), TP_OK);
    for (int round = 0; round < 50; round++) {
        atomic_store(&g_released, 0);
        void *copy = malloc(len);
        memcpy(copy, buf, len);
        tp_datapoint_t *back = NULL;
        cr_assert_eq(tp_tpk_decode(copy, len, NULL, count_release, NULL, &back), TP_OK);
        /* split its components over two datapoints */
        tp_datapoint_t *other = tp_datapoint_new(0);
        tp_tensor_t t;
        tp_tensor_init_empty(&t);
        tp_tensor_move(&t, tp_datapoint_get(back, 1));
        cr_assert_eq(tp_datapoint_append(other, &t), TP_OK);
        cr_assert((uint8_t *)tp_datapoint_cget(other, 0)->data > (uint8_t *)copy &&
                  (uint8_t *)tp_datapoint_cget(back, 0)->data > (uint8_t *)copy &&
                  (uint8_t *)tp_datapoint_cget(other, 0)->data < (uint8_t *)copy + len,
                  "both arrays should be kept in the message");
        pthread_t a, b;
        pthread_create(&a, NULL, destroy_thread, back);
        pthread_create(&b, NULL, destroy_thread, other);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        cr_assert_eq(atomic_load(&g_released), 1);
    }
    free(buf);
    tp_datapoint_destroy(&dp);
}

Test(tensorpack, int64_labels_become_int32_with_a_range_check) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    int64_t n = 3;
    cr_assert_eq(tp_tensor_init(&t, TP_INT64, 1, &n), TP_OK);
    int64_t *v = t.data;
    v[0] = 7;
    v[1] = -2147483648LL;
    v[2] = 2147483647;
    cr_assert_eq(tp_datapoint_append(dp, &t), TP_OK);
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_PICKLE, &buf, &len), TP_OK);
    tp_tpk_opts_t o;
    tp_tpk_opts_init(&o);
    o.int32_labels = 1;
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_tpk_decode(buf, len, &o, NULL, NULL, &back), TP_OK, "%s", tp_last_error());
    const tp_tensor_t *b = tp_datapoint_cget(back, 0);
    cr_assert_eq(b->dtype, TP_INT32);
    cr_assert_eq(((int32_t *)b->data)[0], 7);
    cr_assert_eq(((int32_t *)b->data)[1], INT32_MIN);
    cr_assert_eq(((int32_t *)b->data)[2], INT32_MAX);
    tp_datapoint_destroy(&back);
    free(buf);
    v = tp_datapoint_get(dp, 0)->data;
    v[2] = 2147483648LL;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_MSGPACK, &buf, &len), TP_OK);
    cr_assert_eq(tp_tpk_decode(buf, len, &o, NULL, NULL, &back), TP_ERR_PROTOCOL);
    cr_assert(strstr(tp_last_error(), "2147483648") && strstr(tp_last_error(), "int32"),
              "%s", tp_last_error());
    free(buf);
    tp_datapoint_destroy(&dp);
}

/* Refused with TP_ERR_PROTOCOL and an error that names `what`. */
static void refused(const void *msg, size_t len, const char *what) {
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_tpk_decode(msg, len, NULL, NULL, NULL, &dp);
    cr_assert_eq(rc, TP_ERR_PROTOCOL, "accepted (rc %d); wanted a refusal naming '%s'",
                 rc, what);
    cr_assert_null(dp);
    cr_assert(strstr(tp_last_error(), what), "error '%s' does not name '%s'",
              tp_last_error(), what);
}

#define REFUSED(lit, what) refused(lit, sizeof(lit) - 1, what)

Test(tensorpack, hostile_pickles_are_refused_by_name) {
    /* protocol 2: GLOBAL os system, REDUCE */
    REFUSED("\x80\x02]q\x00(cos\nsystem\nq\x01X\x04\x00\x00\x00trueq\x02\x85q\x03Rq\x04" "e.",
            "global 'os.system' refused");
    /* protocol 4: STACK_GLOBAL builtins eval */
    REFUSED("\x80\x04\x95\x22\x00\x00\x00\x00\x00\x00\x00]\x94\x8c\x08" "builtins\x94\x8c\x04"
            "eval\x94\x93\x94\x8c\x03" "1+1\x94\x85\x94R\x94" "a.", "global 'builtins.eval' refused");
    REFUSED("\x80\x04]\xff.", "opcode 0xff");
    REFUSED("\x80\x04}.", "EMPTY_DICT");
    REFUSED("\x80\x02]q\x00(ci\nj\n", "global 'i.j'");
    REFUSED("\x80\x05]\x96\x00\x00\x00\x00\x00\x00\x00\x40" "abc.", "a length of 4611686018427387904");
    REFUSED("\x80\x05\x95\xff\xff\xff\xff\xff\xff\xff\x7f].", "FRAME of");
    REFUSED("\x80\x04]", "truncated");
    REFUSED("\x80\x04].x", "1 bytes after STOP");
    REFUSED("\x80\x04ha.", "memo 97 was never stored");
    REFUSED("\x80\x04" "a.", "stack underflow");
    REFUSED("\x80\x04K\x01.", "not a list or tuple");
    REFUSED("\x80\x04]N\x85.", "component 0 is None");
    REFUSED("\x80\x04]]a.", "component 0 is a list");
    /* 10,000 nested lists */
    size_t n = 2 + 10000 + 9999 + 1;
    char *deep = malloc(n);
    memcpy(deep, "\x80\x04", 2);
    memset(deep + 2, ']', 10000);
    memset(deep + 10002, 'a', 9999);
    deep[n - 1] = '.';
    refused(deep, n, "nested deeper than 32");
    free(deep);
}

Test(tensorpack, hostile_msgpack_and_zmq_ops_are_refused) {
    /* an array32 claiming 4 billion items in 9 bytes */
    REFUSED("\xdd\xff\xff\xff\xff\x01\x02\x03\x04", "claims 4294967295 items");
    /* a bin32 claiming 4 GB */
    REFUSED("\x91\xc6\xff\xff\xff\xff\x00", "an object of 4294967295 bytes");
    /* 5M nils in an array32: each byte a valid object, too many of them */
    size_t nn = 5 + 5000000;
    uint8_t *nils = malloc(nn);
    memcpy(nils, "\xdd\x00\x4c\x4b\x40", 5);
    memset(nils + 5, 0xc0, nn - 5);
    refused(nils, nn, "more than 4194304 objects");
    free(nils);
    char deep[64];
    memset(deep, 0x91, 63);
    deep[63] = 0x01;
    refused(deep, sizeof deep, "nested deeper than 32");
    REFUSED("\x92\x01\x92\x01\x02", "component 1 is a list");
    REFUSED("\x91\xc0", "component 0 is nil");
    REFUSED("\x91\x81\xa1x\x01", "not a msgpack-numpy array");
    /* {nd: True, type: '<c8', kind: '', shape: [1], data: 8 bytes} */
    REFUSED("\x91\x85\xc4\x02nd\xc3\xc4\x04type\xa3<c8\xc4\x04kind\xc4\x00\xc4\x05shape"
            "\x91\x01\xc4\x04" "data\xc4\x08\x00\x00\x00\x00\x00\x00\x00\x00", "complex");
    REFUSED("\x91\x85\xc4\x02nd\xc3\xc4\x04type\xa3>f4\xc4\x04kind\xc4\x00\xc4\x05shape"
            "\x91\x01\xc4\x04" "data\xc4\x04\x00\x00\x00\x00", "big-endian");
    REFUSED("\x91\x85\xc4\x02nd\xc3\xc4\x04type\xa3<f4\xc4\x04kind\xc4\x01O\xc4\x05shape"
            "\x91\x01\xc4\x04" "data\xc4\x04\x00\x00\x00\x00", "kind 'O'");
    REFUSED("\x91\x85\xc4\x02nd\xc3\xc4\x04type\xa3<f4\xc4\x04kind\xc4\x00\xc4\x05shape"
            "\x91\x02\xc4\x04" "data\xc4\x04\x00\x00\x00\x00", "needs 8 bytes");
    /* zmq_ops: one array claiming 2^62 bytes; an unknown TF dtype */
    REFUSED("\x01\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00"
            "\x00\x00\x00\x00\x00\x00\x00\x40\x01\x02", "says 4611686018427387904 bytes");
    REFUSED("\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
            "\x00\x00\x00\x00\x01", "TensorFlow dtype 7 (string)");
    REFUSED("\x01\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00"
            "\x03\x00\x00\x00\x00\x00\x00\x00\x01\x02\x03", "needs 2 bytes");
    REFUSED("\x01\x00\x00\x00\x04\x00\x00\x00\x09\x00\x00\x00", "9 dimensions");
    REFUSED("\xff\xfe garbage", "no format known");
    /* an empty datapoint in each format */
    REFUSED("\x00\x00\x00\x00", "no components");
    REFUSED("\x90", "no components");
    REFUSED("\x80\x04].", "no components");
}

Test(tensorpack, sniff_tells_the_formats_apart) {
    cr_assert_eq(tp_tpk_sniff("TPW1\x01\x00\x00\x00", 8), TP_TPK_TOWERPACK);
    cr_assert_eq(tp_tpk_sniff("\x80\x05]\x94.", 5), TP_TPK_PICKLE);
    cr_assert_eq(tp_tpk_sniff("\x80\x02].", 4), TP_TPK_PICKLE);
    cr_assert_eq(tp_tpk_sniff("\x80\x01].", 4), TP_TPK_UNKNOWN);
    cr_assert_eq(tp_tpk_sniff("\x92\x01\x02", 3), TP_TPK_MSGPACK);
    cr_assert_eq(tp_tpk_sniff("\x00\x00\x00\x00", 4), TP_TPK_ZMQ_OPS);
    /* 0x90 arrays in zmq_ops begin like a msgpack fixarray: the headers
     * decide; an empty array 0x90 alone is msgpack's */
    cr_assert_eq(tp_tpk_sniff("\x90", 1), TP_TPK_MSGPACK);
    cr_assert_eq(tp_tpk_sniff("", 0), TP_TPK_UNKNOWN);
}

/* ---- the receiver: hostile messages dropped and counted, the stream goes on */

Test(tensorpack, remote_drops_and_counts_hostile_messages_and_goes_on) {
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/tp-tpk-%d.sock", (int)getpid());
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    o.timeout_s = 10;
    tp_dataflow_t *df = tp_df_remote(ep, &o);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    void *ctx = zmq_ctx_new();
    void *push = zmq_socket(ctx, ZMQ_PUSH);
    cr_assert_eq(zmq_connect(push, ep), 0);
    static const struct { const char *m; size_t n; } bad[] = {
        {"\x80\x02]q\x00(cos\nsystem\nq\x01X\x04\x00\x00\x00trueq\x02\x85q\x03Rq\x04" "e.", 38},
        {"\x80\x04]\xff.", 5},
        {"\x80\x05]\x96\x00\x00\x00\x00\x00\x00\x00\x40" "abc.", 16},
        {"\xdd\xff\xff\xff\xff\x01\x02\x03\x04", 9},
        {"\x01\x00\x00\x00\x04\x00\x00\x00\x01\x00", 10},
    };
    size_t nbad = sizeof bad / sizeof *bad;
    for (size_t i = 0; i < nbad; i++)
        cr_assert_eq(zmq_send(push, bad[i].m, bad[i].n, 0), (int)bad[i].n);
    tp_datapoint_t *dp = sample_dp();
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_PICKLE, &buf, &len), TP_OK);
    cr_assert_eq(zmq_send(push, buf, len, 0), (int)len);
    free(buf);
    tp_datapoint_t *copy = tp_datapoint_copy(dp);
    cr_assert_eq(tp_wire_send(push, &copy, NULL), TP_OK);  /* towerpack's own too */
    tp_datapoint_t *got = NULL;
    cr_assert_eq(tp_dataflow_next(df, &got), TP_OK, "%s", tp_last_error());
    cr_assert(tp_datapoint_equal(dp, got));
    tp_datapoint_destroy(&got);
    cr_assert_eq(tp_dataflow_next(df, &got), TP_OK, "%s", tp_last_error());
    cr_assert(tp_datapoint_equal(dp, got));
    tp_datapoint_destroy(&got);
    cr_assert_eq(tp_df_remote_malformed(df), nbad);
    tp_datapoint_destroy(&dp);
    zmq_close(push);
    zmq_ctx_term(ctx);
    tp_dataflow_destroy(&df);
}

/* The decoders' per-thread state (msgpack's zone, reused across messages):
 * four threads decode the same msgpack and pickle messages at once, with a
 * message of thousands of objects (the zone outgrows a datapoint and is
 * freed, then made again) between; every datapoint is checked and freed
 * on the main thread after its decoding thread has exited (ASan: no zone
 * outlives its thread; TSan: nothing shared). */
typedef struct {
    const void *msg[2], *big;
    size_t len[2], big_len;
    tp_datapoint_t *out[2][20];
    int ok;
} decode_job_t;

static void *decode_thread(void *arg) {
    decode_job_t *j = arg;
    j->ok = 1;
    for (int i = 0; i < 20; i++) {
        for (int f = 0; f < 2; f++)
            if (tp_tpk_decode(j->msg[f], j->len[f], NULL, NULL, NULL, &j->out[f][i]) != TP_OK)
                j->ok = 0;
        if (i % 5 == 2) {
            tp_datapoint_t *big = NULL;
            if (tp_tpk_decode(j->big, j->big_len, NULL, NULL, NULL, &big) != TP_OK ||
                tp_datapoint_size(big) != 100)
                j->ok = 0;
            tp_datapoint_destroy(&big);
        }
    }
    return NULL;
}

Test(tensorpack, decoding_on_many_threads_with_datapoints_freed_elsewhere) {
    tp_datapoint_t *dp = sample_dp();
    void *mp, *pk;
    size_t mpl, pkl;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_MSGPACK, &mp, &mpl), TP_OK);
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_PICKLE, &pk, &pkl), TP_OK);
    /* 100 arrays of shape [1,1,...]: 100 maps of 5 keys, ~1,500 objects */
    tp_datapoint_t *many = tp_datapoint_new(0);
    for (int i = 0; i < 100; i++) {
        tp_tensor_t t;
        int64_t shape[4] = {1, 1, 1, 1};
        cr_assert_eq(tp_tensor_init_zero(&t, TP_FLOAT32, 4, shape), TP_OK);
        cr_assert_eq(tp_datapoint_append(many, &t), TP_OK);
    }
    void *big;
    size_t bigl;
    cr_assert_eq(tp_tpk_encode(many, TP_TPK_MSGPACK, &big, &bigl), TP_OK);
    decode_job_t jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].msg[0] = mp;
        jobs[k].len[0] = mpl;
        jobs[k].msg[1] = pk;
        jobs[k].len[1] = pkl;
        jobs[k].big = big;
        jobs[k].big_len = bigl;
        cr_assert_eq(pthread_create(&th[k], NULL, decode_thread, &jobs[k]), 0);
    }
    for (int k = 0; k < 4; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++) {
        cr_assert(jobs[k].ok, "thread %d: a decode failed", k);
        for (int f = 0; f < 2; f++)
            for (int i = 0; i < 20; i++) {
                cr_assert(tp_datapoint_equal(dp, jobs[k].out[f][i]),
                          "thread %d, %s message %d differs", k, f ? "pickle" : "msgpack", i);
                tp_datapoint_destroy(&jobs[k].out[f][i]);
            }
    }
    /* and on this thread, after all that */
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_tpk_decode(mp, mpl, NULL, NULL, NULL, &back), TP_OK);
    cr_assert(tp_datapoint_equal(dp, back));
    tp_datapoint_destroy(&back);
    free(mp);
    free(pk);
    free(big);
    tp_datapoint_destroy(&many);
    tp_datapoint_destroy(&dp);
}

/* ---- msgpack: the fast path against msgpack-c --------------------------- */

/* Both decoders of df_tp_msgpack.c on the same bytes: the same components
 * (dtype, shape, bytes) or both refuse. */
static void s_same_msgpack(const uint8_t *p, size_t n) {
    df_tpk_comps_t a = {0}, b = {0};
    tp_status_t ra = df_tpk_msgpack(p, n, &a), rb = df_tpk_msgpack_generic(p, n, &b);
    cr_assert_eq(ra == TP_OK, rb == TP_OK, "%zu bytes: fast path %d, msgpack-c %d",
                 n, (int)ra, (int)rb);
    cr_assert_eq(a.n, b.n);
    for (int i = 0; ra == TP_OK && i < a.n; i++) {
        const df_tpk_comp_t *x = &a.c[i], *y = &b.c[i];
        cr_assert(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes,
                  "component %d differs", i);
        for (int d = 0; d < x->ndim; d++)
            cr_assert_eq(x->shape[d], y->shape[d]);
        const uint8_t *dx = x->data ? x->data : x->owned ? x->owned : x->inl;
        const uint8_t *dy = y->data ? y->data : y->owned ? y->owned : y->inl;
        cr_assert_eq(memcmp(dx, dy, x->nbytes), 0, "component %d's bytes differ", i);
    }
    df_tpk_comps_fini(&a);
    df_tpk_comps_fini(&b);
}

Test(tensorpack, msgpack_fast_path_agrees_with_msgpack_c) {
    static const struct { const char *p; size_t n; } msgs[] = {
#define M(s) {s, sizeof s - 1}
        /* every scalar type: fixints, u8..u64, i8..i64, float32/64, bools */
        M("\x9f\x05\xe0\xcc\xff\xcd\x12\x34\xce\x01\x02\x03\x04\xcf\x00\x00\x00\x00\x00\x00\x01\x00"
          "\xd0\x80\xd1\xff\x00\xd2\x80\x00\x00\x00\xd3\xff\xff\xff\xff\xff\xff\xff\xfe"
          "\xca\x3f\xc0\x00\x00\xcb\x40\x09\x21\xfb\x54\x44\x2d\x18\xc2\xc3\x00\x7f"),
        /* u64 past int64: refused by both */
        M("\x91\xcf\x80\x00\x00\x00\x00\x00\x00\x00"),
        /* bytes and str in every width */
        M("\x94\xa3" "abc" "\xd9\x01z" "\xc4\x02xy" "\xc5\x00\x01q"),
        /* a msgpack-numpy scalar (nd False) and an array, keys as str */
        M("\x92\x84\xa2nd\xc2\xa4type\xa3<f4\xa4kind\xa0\xa4" "data\xc4\x04\x00\x00\x80\x3f"
          "\x85\xa2nd\xc3\xa4type\xa3|u1\xa4kind\xa0\xa5shape\x92\x02\xcc\x03\xa4"
          "data\xc4\x06\x01\x02\x03\x04\x05\x06"),
        /* an unknown key and a signed dimension: msgpack-c's path decides */
        M("\x91\x86\xc4\x02nd\xc3\xc4\x04type\xa3<i4\xc4\x04kind\xc4\x00\xc4\x05shape"
          "\x91\xd0\x01\xc4\x04" "data\xc4\x04\x01\x00\x00\x00\xc4\x03xyz\xc0"),
        /* map16 and array16 headers */
        M("\xdc\x00\x01\xde\x00\x03\xc4\x02nd\xc2\xc4\x04type\xa3<i8\xc4\x04"
          "data\xc4\x08\x01\x00\x00\x00\x00\x00\x00\x00"),
        /* a list, nil, an ext: refused by both */
        M("\x92\x01\x91\x02"), M("\x91\xc0"), M("\x91\xd4\x01\x02"),
        /* trailing bytes, a shape that does not fit the data */
        M("\x91\x01\x01"),
        M("\x91\x85\xc4\x02nd\xc3\xc4\x04type\xa3<f4\xc4\x04kind\xc4\x00\xc4\x05shape"
          "\x91\x02\xc4\x04" "data\xc4\x04\x00\x00\x00\x00"),
#undef M
    };
    for (size_t m = 0; m < sizeof msgs / sizeof *msgs; m++) {
        const uint8_t *p = (const uint8_t *)msgs[m].p;
        size_t n = msgs[m].n;
        uint8_t *q = malloc(n);
        /* the message, every prefix, and every byte flipped to a few values */
        for (size_t k = 0; k <= n; k++)
            s_same_msgpack(p, k);
        for (size_t i = 0; i < n; i++)
            for (int v = 0; v < 256; v += 17) {
                memcpy(q, p, n);
                q[i] = (uint8_t)v;
                s_same_msgpack(q, n);
            }
        free(q);
    }
    /* what towerpack itself writes: every dtype, a big array, a scalar */
    tp_datapoint_t *dp = sample_dp();
    void *buf;
    size_t len;
    cr_assert_eq(tp_tpk_encode(dp, TP_TPK_MSGPACK, &buf, &len), TP_OK);
    s_same_msgpack(buf, len);
    df_tpk_comps_t cs = {0};
    cr_assert_eq(df_tpk_msgpack(buf, len, &cs), TP_OK, "%s", tp_last_error());
    cr_assert_eq(cs.n, 8);
    df_tpk_comps_fini(&cs);
    free(buf);
    tp_datapoint_destroy(&dp);
}
