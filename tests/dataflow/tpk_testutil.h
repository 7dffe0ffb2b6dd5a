/* towerpack tests: helpers of the tensorpack tests (the Python peer
 * tensorpack_peer.py, its truth files, comparing datapoints with them). */
#ifndef TP_TPK_TESTUTIL_H
#define TP_TPK_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>

#define TPK_PEER TP_SOURCE_DIR "/tests/dataflow/tensorpack_peer.py"

/* A python3 with numpy, msgpack, msgpack_numpy, zmq and lmdb, or NULL with
 * the reason in why. */
static inline const char *tpk_python(char *why, size_t size) {
    static const char *const cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s %s check >/dev/null 2>&1", cands[i], TPK_PEER);
        if (system(cmd) == 0)
            return cands[i];
    }
    snprintf(why, size, "no python3 with numpy, msgpack, msgpack_numpy, zmq and lmdb "
             "(apt-get install python3-numpy python3-msgpack python3-msgpack-numpy "
             "python3-zmq python3-lmdb)");
    return NULL;
}

/* Run the peer with `args`; its exit status. */
static inline int tpk_run(const char *py, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s", py, TPK_PEER, args);
    return system(cmd);
}

static inline void *tpk_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    cr_assert(p);
    cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return p;
}

static inline const char *tpk_np(tp_dtype_t dt) {
    switch (dt) {
    case TP_UINT8: return "|u1";
    case TP_INT32: return "<i4";
    case TP_INT64: return "<i8";
    case TP_FLOAT16: return "<f2";
    case TP_FLOAT32: return "<f4";
    case TP_FLOAT64: return "<f8";
    default: return "?";
    }
}

/* A truth line of component t: "dtype d0,d1 hex" (as the peer writes). */
static inline char *tpk_describe(const tp_tensor_t *t) {
    size_t cap = 64 + t->nbytes * 2 + 16 * TP_MAX_DIMS;
    char *s = malloc(cap);
    cr_assert(s);
    size_t o = (size_t)snprintf(s, cap, "%s ", tpk_np(t->dtype));
    for (int k = 0; k < t->ndim; k++)
        o += (size_t)snprintf(s + o, cap - o, "%s%lld", k ? "," : "", (long long)t->shape[k]);
    o += (size_t)snprintf(s + o, cap - o, " ");
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->nbytes; i++)
        o += (size_t)snprintf(s + o, cap - o, "%02x", p[i]);
    if (!t->nbytes)
        o += (size_t)snprintf(s + o, cap - o, "-");
    return s;
}

/* Assert that dp matches the truth text (one line per component, a
 * terminating "=" line or the end of the text); returns where it ended. */
static inline const char *tpk_expect(const tp_datapoint_t *dp, const char *truth) {
    const char *p = truth;
    int n = tp_datapoint_size(dp);
    for (int i = 0; i < n; i++) {
        const char *e = strchr(p, '\n');
        cr_assert(e && strncmp(p, "=\n", 2), "component %d more than the truth has", i);
        char *got = tpk_describe(tp_datapoint_cget(dp, i));
        size_t l = (size_t)(e - p);
        cr_assert(strlen(got) == l && !memcmp(got, p, l),
                  "component %d:\n  got    %.200s\n  wanted %.200s", i, got, p);
        free(got);
        p = e + 1;
    }
    cr_assert(*p == '\0' || !strncmp(p, "=\n", 2), "fewer components than the truth (%d)", n);
    return *p ? p + 2 : p;
}

#endif
