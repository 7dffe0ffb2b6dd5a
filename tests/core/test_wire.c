/* towerpack tests: the datapoint wire format. Round trips for every dtype
 * and several shapes, with and without lz4 and checksums, zero-copy and
 * ownership, and every class of malformed message. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/towerpack.h>

/* A datapoint with one component per dtype, filled from the RNG; `scale`
 * multiplies every dimension so small and large shapes are covered. */
static tp_datapoint_t *s_make(uint64_t seed, int scale, int compressible) {
    tp_rng_t r;
    tp_rng_init(&r, seed, 0);
    tp_datapoint_t *dp = tp_datapoint_new(TP_DTYPE_COUNT + 1);
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        int64_t shape[3] = {scale, 3, 1 + d};
        tp_tensor_t *t = tp_datapoint_get(dp, d);
        cr_assert_eq(tp_tensor_init(t, (tp_dtype_t)d, 1 + d % 3, shape), TP_OK);
        uint8_t *p = t->data;
        for (size_t i = 0; i < t->nbytes; i++)
            p[i] = compressible ? (uint8_t)(i / 64) : (uint8_t)tp_rng_u32(&r);
    }
    /* and a scalar */
    tp_tensor_init(tp_datapoint_get(dp, TP_DTYPE_COUNT), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, TP_DTYPE_COUNT)->data = (int32_t)seed;
    return dp;
}

static void s_round_trip(int scale, int lz4, int checksum, int compressible) {
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.lz4 = lz4;
    o.checksum = checksum;
    tp_datapoint_t *dp = s_make((uint64_t)scale * 31 + lz4, scale, compressible);
    tp_datapoint_t *expect = tp_datapoint_copy(dp);
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, &o, msg), TP_OK, "%s", tp_last_error());
    cr_assert_null(dp, "encode takes the datapoint");
    cr_assert_eq(tp_wire_msg_frames(msg), TP_DTYPE_COUNT + 2);
    if (lz4 && compressible && scale >= 64)
        cr_assert(tp_wire_msg_bytes(msg) < tp_datapoint_nbytes(expect) / 2,
                  "lz4 shrinks compressible data");
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_wire_decode(msg, &o, &back), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_wire_msg_frames(msg), 0, "decode consumes the frames");
    cr_assert(tp_datapoint_equal(expect, back), "scale %d lz4 %d", scale, lz4);
    tp_datapoint_destroy(&back);
    tp_datapoint_destroy(&expect);
    tp_wire_msg_destroy(&msg);
}

Test(wire, round_trip_every_dtype_and_shape) {
    int scales[] = {0, 1, 7, 64, 1000};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        for (int lz4 = 0; lz4 <= 1; lz4++)
            for (int ck = 0; ck <= 1; ck++)
                for (int comp = 0; comp <= 1; comp++)
                    s_round_trip(scales[i], lz4, ck, comp);
}

Test(wire, empty_components_travel_as_shape_zero) {
    tp_datapoint_t *dp = tp_datapoint_new(2), *back = NULL;
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL); /* a real scalar */
    *(int32_t *)tp_datapoint_get(dp, 1)->data = 7;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, NULL, msg), TP_OK);
    cr_assert_eq(tp_wire_decode(msg, NULL, &back), TP_OK, "%s", tp_last_error());
    const tp_tensor_t *e = tp_datapoint_get(back, 0);
    cr_assert_eq(e->ndim, 1);
    cr_assert_eq(e->shape[0], 0);
    cr_assert_eq(e->nbytes, 0);
    cr_assert_eq(tp_datapoint_get(back, 1)->ndim, 0);
    cr_assert_eq(*(int32_t *)tp_datapoint_get(back, 1)->data, 7);
    tp_datapoint_destroy(&back);
    tp_wire_msg_destroy(&msg);
}

Test(wire, empty_datapoint_round_trips) {
    tp_datapoint_t *dp = tp_datapoint_new(0), *back = NULL;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, NULL, msg), TP_OK);
    cr_assert_eq(tp_wire_decode(msg, NULL, &back), TP_OK);
    cr_assert_eq(tp_datapoint_size(back), 0);
    tp_datapoint_destroy(&back);
    tp_wire_msg_destroy(&msg);
}

static int s_freed;
static void s_count_free(void *data, void *hint) {
    (void)hint;
    s_freed++;
    free(data);
}

Test(wire, encode_is_zero_copy_and_frees_after_last_frame) {
    size_t n = 1 << 20;
    float *buf = malloc(n);
    memset(buf, 1, n);
    int64_t shape[] = {(int64_t)(n / 4)};
    tp_datapoint_t *dp = tp_datapoint_new(1);
    tp_tensor_init_wrap(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape, buf,
                        s_count_free, NULL);
    s_freed = 0;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, NULL, msg), TP_OK);
    cr_assert_eq(tp_wire_msg_frame_data(msg, 1), (const void *)buf,
                 "the component frame points at the tensor's own buffer");
    cr_assert_eq(s_freed, 0, "datapoint alive while its frames are");
    tp_wire_msg_destroy(&msg);
    cr_assert_eq(s_freed, 1, "datapoint freed with its last frame");
}

Test(wire, decode_keeps_large_frames_without_copy) {
    tp_wire_msg_t *msg = tp_wire_msg_new();
    int64_t shape[] = {4096};
    tp_datapoint_t *dp = tp_datapoint_new(1), *back = NULL;
    tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape);
    cr_assert_eq(tp_wire_encode(&dp, NULL, msg), TP_OK);
    const void *frame = tp_wire_msg_frame_data(msg, 1);
    cr_assert_eq(tp_wire_decode(msg, NULL, &back), TP_OK);
    cr_assert_eq(tp_datapoint_get(back, 0)->data, frame);
    tp_datapoint_destroy(&back);
    tp_wire_msg_destroy(&msg);
}

/* ---- malformed messages ------------------------------------------------- */

/* A valid two-component message's raw frames, to corrupt. */
typedef struct {
    uint8_t hdr[256];
    size_t hdr_size;
    uint8_t f1[64];
    uint8_t f2[4];
} s_raw_t;

static void s_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void s_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void s_raw_valid(s_raw_t *r) {
    memset(r, 0, sizeof *r);
    uint8_t *h = r->hdr;
    s_put32(h, TP_WIRE_MAGIC);
    h[4] = TP_WIRE_VERSION;
    h[5] = 0;
    h[6] = 2;
    h[7] = 0;
    uint8_t *c = h + 8; /* float32 [4,4] */
    c[0] = TP_FLOAT32; c[1] = 2; c[2] = TP_WIRE_CODEC_NONE;
    s_put64(c + 8, 64);
    s_put64(c + 16, 64);
    s_put64(c + 24, 4);
    s_put64(c + 32, 4);
    c = h + 8 + 40; /* int32 scalar */
    c[0] = TP_INT32; c[1] = 0; c[2] = TP_WIRE_CODEC_NONE;
    s_put64(c + 8, 4);
    s_put64(c + 16, 4);
    r->hdr_size = 8 + 40 + 24;
}

static tp_status_t s_decode_raw(const s_raw_t *r, int nframes) {
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (nframes > 0)
        tp_wire_msg_add_frame(msg, r->hdr, r->hdr_size);
    if (nframes > 1)
        tp_wire_msg_add_frame(msg, r->f1, sizeof r->f1);
    if (nframes > 2)
        tp_wire_msg_add_frame(msg, r->f2, sizeof r->f2);
    for (int i = 3; i < nframes; i++)
        tp_wire_msg_add_frame(msg, r->f2, sizeof r->f2);
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_wire_decode(msg, NULL, &dp);
    if (rc == TP_OK)
        tp_datapoint_destroy(&dp);
    else
        cr_assert_null(dp);
    cr_assert_eq(tp_wire_msg_frames(msg), 0);
    tp_wire_msg_destroy(&msg);
    return rc;
}

#define EXPECT_BAD(r, nframes, text)                                          \
    do {                                                                      \
        cr_assert_eq(s_decode_raw((r), (nframes)), TP_ERR_PROTOCOL,           \
                     "expected a protocol error for: %s", text);              \
        cr_assert(strstr(tp_last_error(), text), "message '%s' lacks '%s'",   \
                  tp_last_error(), text);                                     \
    } while (0)

Test(wire, the_reference_message_is_valid) {
    s_raw_t r;
    s_raw_valid(&r);
    cr_assert_eq(s_decode_raw(&r, 3), TP_OK, "%s", tp_last_error());
}

Test(wire, rejects_every_malformed_class) {
    s_raw_t r;
    s_raw_valid(&r); EXPECT_BAD(&r, 0, "empty message");
    s_raw_valid(&r); r.hdr_size = 5; EXPECT_BAD(&r, 3, "header frame of 5 bytes");
    s_raw_valid(&r); r.hdr[0] ^= 0xff; EXPECT_BAD(&r, 3, "bad magic");
    s_raw_valid(&r); r.hdr[4] = 9; EXPECT_BAD(&r, 3, "version 9");
    s_raw_valid(&r); r.hdr[5] = 0x80; EXPECT_BAD(&r, 3, "unknown flags");
    s_raw_valid(&r); r.hdr[6] = 0xff; r.hdr[7] = 0xff; EXPECT_BAD(&r, 3, "65535 components");
    s_raw_valid(&r); EXPECT_BAD(&r, 2, "but 1 frames follow");
    s_raw_valid(&r); EXPECT_BAD(&r, 5, "but 4 frames follow");
    s_raw_valid(&r); r.hdr_size = 8 + 20; EXPECT_BAD(&r, 3, "header truncated in component 0");
    s_raw_valid(&r); r.hdr_size = 8 + 30; EXPECT_BAD(&r, 3, "header truncated in the shape of component 0");
    s_raw_valid(&r); r.hdr[8] = 77; EXPECT_BAD(&r, 3, "unknown dtype 77");
    s_raw_valid(&r); r.hdr[9] = 9; EXPECT_BAD(&r, 3, "9 dimensions");
    s_raw_valid(&r); r.hdr[11] = 1; EXPECT_BAD(&r, 3, "reserved byte");
    s_raw_valid(&r); s_put64(r.hdr + 8 + 24, (uint64_t)-4); EXPECT_BAD(&r, 3, "bad shape");
    s_raw_valid(&r); s_put64(r.hdr + 8 + 24, 5); EXPECT_BAD(&r, 3, "shape says 80 bytes");
    s_raw_valid(&r); s_put64(r.hdr + 8 + 24, 1ull << 62); EXPECT_BAD(&r, 3, "bad shape");
    s_raw_valid(&r); s_put64(r.hdr + 8 + 16, 63); EXPECT_BAD(&r, 3, "frame has 64");
    s_raw_valid(&r); r.hdr[10] = 7; EXPECT_BAD(&r, 3, "unknown codec 7");
    s_raw_valid(&r); r.hdr[12] = 1; EXPECT_BAD(&r, 3, "checksum without the flag");
    s_raw_valid(&r); r.hdr_size += 3; EXPECT_BAD(&r, 3, "3 trailing bytes");
}

Test(wire, rejects_size_claims_before_allocating) {
    s_raw_t r;
    /* Claims 2^40 elements but sends 64 bytes: must fail on the claim. */
    s_raw_valid(&r);
    s_put64(r.hdr + 8 + 24, 1ull << 20);
    s_put64(r.hdr + 8 + 32, 1ull << 20);
    s_put64(r.hdr + 8 + 8, 4ull << 40);
    EXPECT_BAD(&r, 3, "limit");
    /* lz4 claiming an impossible expansion ratio. */
    s_raw_valid(&r);
    r.hdr[10] = TP_WIRE_CODEC_LZ4;
    s_put64(r.hdr + 8 + 24, 4096);
    s_put64(r.hdr + 8 + 32, 4096);
    s_put64(r.hdr + 8 + 8, 4ull * 4096 * 4096);
    EXPECT_BAD(&r, 3, "lz4 sizes impossible");
    /* lz4 with a plausible ratio but garbage payload. */
    s_raw_valid(&r);
    r.hdr[10] = TP_WIRE_CODEC_LZ4;
    s_put64(r.hdr + 8 + 24, 16);
    s_put64(r.hdr + 8 + 8, 16 * 4 * 4);
    memset(r.f1, 0xff, sizeof r.f1);
    EXPECT_BAD(&r, 3, "lz4 data is corrupt");
}

Test(wire, respects_configured_limit) {
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.max_bytes = 1000;
    int64_t shape[] = {1001};
    tp_datapoint_t *dp = tp_datapoint_new(1), *back = NULL;
    tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_UINT8, 1, shape);
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, &o, msg), TP_OK);
    cr_assert_eq(tp_wire_decode(msg, &o, &back), TP_ERR_PROTOCOL);
    cr_assert(strstr(tp_last_error(), "1000-byte limit"));
    tp_wire_msg_destroy(&msg);
}

Test(wire, checksum_catches_corruption) {
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.checksum = 1;
    int64_t shape[] = {100};
    tp_datapoint_t *dp = tp_datapoint_new(1), *back = NULL;
    tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_UINT8, 1, shape);
    tp_wire_msg_t *msg = tp_wire_msg_new();
    cr_assert_eq(tp_wire_encode(&dp, &o, msg), TP_OK);
    /* Rebuild the message with one payload byte flipped. */
    tp_wire_msg_t *bad = tp_wire_msg_new();
    tp_wire_msg_add_frame(bad, tp_wire_msg_frame_data(msg, 0), tp_wire_msg_frame_size(msg, 0));
    uint8_t payload[100] = {0};
    payload[50] = 1;
    tp_wire_msg_add_frame(bad, payload, sizeof payload);
    cr_assert_eq(tp_wire_decode(bad, &o, &back), TP_ERR_PROTOCOL);
    cr_assert(strstr(tp_last_error(), "checksum"));
    tp_wire_msg_destroy(&bad);
    tp_wire_msg_destroy(&msg);
}

Test(wire, random_corruption_never_crashes) {
    tp_rng_t r;
    tp_rng_init(&r, 99, 0);
    int ok = 0, bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        tp_wire_opts_t o;
        tp_wire_opts_init(&o);
        o.lz4 = iter & 1;
        o.checksum = (iter >> 1) & 1;
        o.lz4_min_bytes = 16;
        tp_datapoint_t *dp = s_make((uint64_t)iter, 1 + iter % 9, iter % 3 == 0);
        tp_wire_msg_t *msg = tp_wire_msg_new();
        cr_assert_eq(tp_wire_encode(&dp, &o, msg), TP_OK);
        tp_wire_msg_t *mut = tp_wire_msg_new();
        int drop = tp_rng_below(&r, 8) == 0 ? (int)tp_rng_below(&r, (uint64_t)tp_wire_msg_frames(msg)) : -1;
        for (int f = 0; f < tp_wire_msg_frames(msg); f++) {
            if (f == drop)
                continue;
            size_t size = tp_wire_msg_frame_size(msg, f);
            uint8_t *copy = malloc(size + 8);
            memcpy(copy, tp_wire_msg_frame_data(msg, f), size);
            if (size && tp_rng_below(&r, 3) == 0)
                copy[tp_rng_below(&r, size)] ^= (uint8_t)(1 + tp_rng_below(&r, 255));
            if (size && tp_rng_below(&r, 10) == 0)
                size = (size_t)tp_rng_below(&r, size);
            tp_wire_msg_add_frame(mut, copy, size);
            free(copy);
        }
        tp_datapoint_t *back = NULL;
        tp_status_t rc = tp_wire_decode(mut, &o, &back);
        cr_assert(rc == TP_OK || rc == TP_ERR_PROTOCOL, "status %d", rc);
        if (rc == TP_OK) {
            ok++;
            cr_assert_not_null(back);
        } else {
            bad++;
            cr_assert(strncmp(tp_last_error(), "wire: ", 6) == 0);
        }
        tp_datapoint_destroy(&back);
        tp_wire_msg_destroy(&mut);
        tp_wire_msg_destroy(&msg);
    }
    cr_assert(bad > 1000, "most mutations must be caught (%d ok, %d bad)", ok, bad);
}

/* ---- over real sockets -------------------------------------------------- */

static void s_socket_round_trip(const char *endpoint, int lz4) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    void *push = zmq_socket(ctx, ZMQ_PUSH);
    int timeout = 5000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    cr_assert_eq(zmq_bind(pull, endpoint), 0);
    cr_assert_eq(zmq_connect(push, endpoint), 0);
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.lz4 = lz4;
    for (int i = 0; i < 20; i++) {
        tp_datapoint_t *dp = s_make((uint64_t)i, 1 + i * 50, i % 2);
        tp_datapoint_t *expect = tp_datapoint_copy(dp), *back = NULL;
        cr_assert_eq(tp_wire_send(push, &dp, &o), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_wire_recv(pull, &o, &back), TP_OK, "%s", tp_last_error());
        cr_assert(tp_datapoint_equal(expect, back));
        tp_datapoint_destroy(&expect);
        tp_datapoint_destroy(&back);
    }
    /* A peer sending too many frames: dropped whole, then the next is fine. */
    for (int i = 0; i < TP_DP_MAX_COMPONENTS + 5; i++)
        zmq_send(push, "x", 1, ZMQ_SNDMORE);
    zmq_send(push, "x", 1, 0);
    tp_datapoint_t *back = NULL;
    cr_assert_eq(tp_wire_recv(pull, &o, &back), TP_ERR_PROTOCOL);
    cr_assert(strstr(tp_last_error(), "dropped"));
    tp_datapoint_t *dp = tp_datapoint_new(0);
    cr_assert_eq(tp_wire_send(push, &dp, &o), TP_OK);
    cr_assert_eq(tp_wire_recv(pull, &o, &back), TP_OK);
    tp_datapoint_destroy(&back);
    /* Nothing there: a bounded wait, reported as a timeout. */
    timeout = 50;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    cr_assert_eq(tp_wire_recv(pull, &o, &back), TP_ERR_TIMEOUT);
    int linger = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(push);
    zmq_close(pull);
    zmq_ctx_term(ctx);
}

Test(wire, over_inproc) { s_socket_round_trip("inproc://wire-test", 0); }
Test(wire, over_ipc_with_lz4) {
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/tp-wire-test-%d", (int)getpid());
    s_socket_round_trip(ep, 1);
    unlink(ep + strlen("ipc://"));
}

/* Issue 47, the job handshake: a PULL socket's job id reaches the sender
 * of each message (zmq_msg_gets), and tp_wire_probe_job reads the
 * receiver's over tcp and ipc, "" from one without; a closed port and an
 * inproc endpoint are clear errors, a bad id is refused. */
Test(wire, job_ids_travel_both_ways) {
    cr_assert(tp_wire_job_ok("run-2026.11.28_a"));
    cr_assert(!tp_wire_job_ok(""));
    cr_assert(!tp_wire_job_ok("a b"));
    cr_assert(!tp_wire_job_ok("a:b"));
    void *ctx = zmq_ctx_new();
    char ipc[128];
    snprintf(ipc, sizeof ipc, "ipc:///tmp/tp-wire-job-%d", (int)getpid());
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(tp_wire_set_job(pull, "a b"), TP_ERR_INVALID);
    cr_assert_eq(tp_wire_set_job(pull, "job-B"), TP_OK, "%s", tp_last_error());
    cr_assert_eq(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    cr_assert_eq(zmq_bind(pull, ipc), 0);
    char tcp[128];
    size_t tl = sizeof tcp;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, tcp, &tl);
    char job[TP_WIRE_JOB_MAX];
    cr_assert_eq(tp_wire_probe_job(tcp, 2000, job, sizeof job), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(job, "job-B");
    cr_assert_eq(tp_wire_probe_job(ipc, 2000, job, sizeof job), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(job, "job-B");
    /* the sender's id on each message it sends; none from a plain sender */
    void *push = zmq_socket(ctx, ZMQ_PUSH), *plain = zmq_socket(ctx, ZMQ_PUSH);
    cr_assert_eq(tp_wire_set_job(push, "job-A"), TP_OK);
    cr_assert_eq(zmq_connect(push, tcp), 0);
    cr_assert_eq(zmq_connect(plain, ipc), 0);
    zmq_send(push, "x", 1, 0);
    zmq_send(plain, "y", 1, 0);
    int timeout = 5000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    tp_wire_msg_t *m = tp_wire_msg_new();
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(tp_wire_msg_recv(m, pull, 0), TP_OK);
        const char *who = tp_wire_msg_frame_job(m, 0);
        /* where the sender is: tcp its address, ipc its process */
        const char *peer = tp_wire_msg_frame_peer(m, 0);
        char pid[32];
        snprintf(pid, sizeof pid, ":%d", (int)getpid());
        cr_assert(peer, "no Peer-Address");
        int x = *(const char *)tp_wire_msg_frame_data(m, 0) == 'x';
        if (x)
            cr_assert(who && !strcmp(who, "job-A"), "%s", who ? who : "(none)");
        else
            cr_assert_null(who);
        /* 'x' came on the last endpoint bound (LAST_ENDPOINT), 'y' on ipc */
        if (x && !strncmp(tcp, "tcp://", 6))
            cr_assert_str_eq(peer, "127.0.0.1");
        else
            cr_assert(strlen(peer) > strlen(pid) &&
                      !strcmp(peer + strlen(peer) - strlen(pid), pid), "%s", peer);
    }
    tp_wire_msg_destroy(&m);
    /* a receiver without an id */
    void *anon = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(zmq_bind(anon, "tcp://127.0.0.1:*"), 0);
    char anon_ep[128];
    tl = sizeof anon_ep;
    zmq_getsockopt(anon, ZMQ_LAST_ENDPOINT, anon_ep, &tl);
    strcpy(job, "stale");
    cr_assert_eq(tp_wire_probe_job(anon_ep, 2000, job, sizeof job), TP_OK, "%s",
                 tp_last_error());
    cr_assert_str_eq(job, "");
    int linger = 0;
    void *socks[] = {push, plain, pull, anon};
    for (int i = 0; i < 4; i++) {
        zmq_setsockopt(socks[i], ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(socks[i]);
    }
    zmq_ctx_term(ctx);
    unlink(ipc + strlen("ipc://"));
    /* nobody there, or not a socket it can reach */
    cr_assert_eq(tp_wire_probe_job(anon_ep, 500, job, sizeof job), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), anon_ep), "%s", tp_last_error());
    cr_assert_eq(tp_wire_probe_job("inproc://x", 500, job, sizeof job), TP_ERR_UNSUPPORTED);
}

/* Sixteen components with long names: near the longest text a receiver sends. */
static const char s_long_comps[] =
    "component_number_00:float32[*,3,224,224];component_number_01:float32[*,3,224,224];"
    "component_number_02:float32[*,3,224,224];component_number_03:float32[*,3,224,224];"
    "component_number_04:float32[*,3,224,224];component_number_05:float32[*,3,224,224];"
    "component_number_06:float32[*,3,224,224];component_number_07:float32[*,3,224,224];"
    "component_number_08:float32[*,3,224,224];component_number_09:float32[*,3,224,224];"
    "component_number_10:float32[*,3,224,224];component_number_11:float32[*,3,224,224];"
    "component_number_12:float32[*,3,224,224];component_number_13:float32[*,3,224,224];"
    "component_number_14:float32[*,3,224,224];component_number_15:int64[*,1000]";

/* The probe of a CURVE receiver: the CurveZMQ handshake made by hand with
 * the run's client keys reads its job id; with another client key the
 * receiver's ZAP handler refuses it. */
Test(wire, job_id_of_a_curve_receiver) {
    if (!tp_curve_available())
        cr_skip_test("this libzmq has no CURVE");
    char dir[64], other[64];
    snprintf(dir, sizeof dir, "/tmp/tp-wire-keys-%d", (int)getpid());
    snprintf(other, sizeof other, "/tmp/tp-wire-keys2-%d", (int)getpid());
    cr_assert_eq(tp_curve_keygen(dir), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_curve_keygen(other), TP_OK, "%s", tp_last_error());
    tp_curve_t *server = tp_curve_load(dir, 1), *client = tp_curve_load(dir, 0),
               *stranger = tp_curve_load(other, 0);
    cr_assert(server && client && stranger, "%s", tp_last_error());
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(tp_curve_apply(server, ctx, pull), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_wire_set_job(pull, "job-C"), TP_OK);
    cr_assert_eq(tp_wire_set_comps(pull, s_long_comps), TP_OK, "%s", tp_last_error());
    cr_assert_eq(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t el = sizeof ep;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &el);
    uint8_t keys[96];
    cr_assert_eq(tp_curve_client_keys(server, keys), TP_ERR_INVALID);
    cr_assert_eq(tp_curve_client_keys(client, keys), TP_OK);
    char job[TP_WIRE_JOB_MAX];
    cr_assert_eq(tp_wire_probe_job_curve(ep, 3000, keys, job, sizeof job), TP_OK, "%s",
                 tp_last_error());
    cr_assert_str_eq(job, "job-C");
    /* its components come through the CURVE READY too (about 1 KiB there) */
    tp_wire_peer_t peer;
    cr_assert_eq(tp_wire_probe_peer(ep, 3000, keys, &peer), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(peer.comps, s_long_comps);
    /* the NULL probe cannot ask it */
    cr_assert_lt(tp_wire_probe_job(ep, 3000, job, sizeof job), 0);
    /* another run's keys: the server key does not open its WELCOME */
    cr_assert_eq(tp_curve_client_keys(stranger, keys), TP_OK);
    cr_assert_lt(tp_wire_probe_job_curve(ep, 3000, keys, job, sizeof job), 0);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    tp_curve_destroy(&server);
    tp_curve_destroy(&client);
    tp_curve_destroy(&stranger);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, other);
    cr_assert_eq(system(cmd), 0);
}

/* Issue 47, the component handshake: a receiver's components as text
 * (X-Tp-Comps) round-trip, a peer's malformed text is refused, and the
 * check names the component, what is expected and what came. */
Test(wire, components_round_trip_and_name_the_mismatch) {
    tp_wire_comp_t want[2] = {{"image", TP_UINT8, 3, {64, 28, 28}, 0, 0, 0},
                              {"label", TP_INT32, 1, {-1}, 0, 0, 0}};
    char text[TP_WIRE_COMPS_MAX];
    cr_assert_gt(tp_wire_comps_format(want, 2, text, sizeof text), 0);
    cr_assert_str_eq(text, "image:uint8[64,28,28];label:int32[*]");
    tp_wire_comp_t back[TP_WIRE_COMPS_N];
    cr_assert_eq(tp_wire_comps_parse(text, back, TP_WIRE_COMPS_N), 2);
    cr_assert_eq(memcmp(back, want, sizeof want), 0);
    cr_assert_eq(tp_wire_comps_parse("x:float32[]", back, 4), 1);
    cr_assert_eq(back[0].ndim, 0);
    const char *bad[] = {"image", "image:uint8", "image:uint9[2]", "a:uint8[2,]",
                         "a:uint8[2];", "a b:uint8[2]", "a:uint8[99999999999999999999]",
                         "a:uint8[1,2,3,4,5,6,7,8,9]", "a:uint8[2]x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_lt(tp_wire_comps_parse(bad[i], back, TP_WIRE_COMPS_N), 0, "%s", bad[i]);
    cr_assert_lt(tp_wire_comps_parse("a:uint8[2];b:uint8[2]", back, 1), 0);
    /* what tp-worker and the trainer say */
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    int64_t img[3] = {64, 28, 28}, lab[1] = {64};
    cr_assert_eq(tp_tensor_init_zero(&t, TP_FLOAT32, 3, img), TP_OK);
    tp_datapoint_append(dp, &t);
    char why[400];
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "1 component (float32[64,28,28]), expected 2: image "
                          "uint8[64,28,28], label int32[*]");
    cr_assert_eq(tp_tensor_init_zero(&t, TP_INT32, 1, lab), TP_OK);
    tp_datapoint_append(dp, &t);
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "component 0 'image' is float32[64,28,28], expected "
                          "uint8[64,28,28]");
    want[0].dtype = TP_FLOAT32;
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), 0);
    want[0].shape[1] = 32;
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "component 0 'image' is float32[64,28,28], expected "
                          "float32[64,32,28]");
    tp_datapoint_destroy(&dp);
}

/* Issue 47: an integer component's values travel with it ("{0..9}": a
 * model's classes); a datapoint whose shapes fit but whose label is out of
 * range is named with the value, where it is and the range; a range on a
 * float component or an empty one does not parse. */
Test(wire, a_value_out_of_range_is_named) {
    tp_wire_comp_t want[2] = {{"image", TP_UINT8, 2, {28, 28}, 0, 0, 0},
                              {"label", TP_INT32, 1, {4}, 1, 0, 9}};
    char text[TP_WIRE_COMPS_MAX];
    cr_assert_gt(tp_wire_comps_format(want, 2, text, sizeof text), 0);
    cr_assert_str_eq(text, "image:uint8[28,28];label:int32[4]{0..9}");
    tp_wire_comp_t back[TP_WIRE_COMPS_N];
    cr_assert_eq(tp_wire_comps_parse(text, back, TP_WIRE_COMPS_N), 2);
    cr_assert_eq(memcmp(back, want, sizeof want), 0);
    cr_assert_eq(tp_wire_comps_parse("t:int64[*,8]{-1..255}", back, 4), 1);
    cr_assert(back[0].ranged && back[0].lo == -1 && back[0].hi == 255);
    const char *bad[] = {"x:float32[2]{0..9}", "x:int32[2]{3..1}", "x:int32[2]{0..}",
                         "x:int32[2]{..9}", "x:int32[2]{0.9}", "x:int32[2]{0..9",
                         "x:int32[2]{0..9}y"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_lt(tp_wire_comps_parse(bad[i], back, TP_WIRE_COMPS_N), 0, "%s", bad[i]);
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    int64_t img[2] = {28, 28}, lab[1] = {4};
    cr_assert_eq(tp_tensor_init_zero(&t, TP_UINT8, 2, img), TP_OK);
    memset(t.data, 200, 28 * 28);  /* pixels: not ranged */
    tp_datapoint_append(dp, &t);
    cr_assert_eq(tp_tensor_init_zero(&t, TP_INT32, 1, lab), TP_OK);
    int32_t *y = t.data;
    y[0] = 3, y[1] = 9, y[2] = 12, y[3] = -1;
    tp_datapoint_append(dp, &t);
    char why[400];
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "component 1 'label' has value 12 at [2], expected 0..9");
    y = tp_datapoint_get(dp, 1)->data;
    y[2] = 0;
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "component 1 'label' has value -1 at [3], expected 0..9");
    y[3] = 5;
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), 0, "%s", why);
    /* a shape mismatch is named first, values after */
    y[0] = 50;
    want[0].shape[0] = 32;
    cr_assert_eq(tp_wire_comps_check(want, 2, dp, why, sizeof why), -1);
    cr_assert_str_eq(why, "component 0 'image' is uint8[28,28], expected uint8[32,28]");
    tp_datapoint_destroy(&dp);
}

/* The probe reads a receiver's components with its job id, from a NULL
 * receiver; a receiver without components gives none. */
Test(wire, components_of_a_receiver_travel_in_the_probe) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(tp_wire_set_comps(pull, "not components"), TP_ERR_INVALID);
    cr_assert_eq(tp_wire_set_comps(pull, ""), TP_ERR_INVALID);
    cr_assert_eq(tp_wire_set_job(pull, "job-D"), TP_OK);
    cr_assert_eq(tp_wire_set_comps(pull, "image:uint8[64,28,28];label:int32[64]"), TP_OK,
                 "%s", tp_last_error());
    cr_assert_eq(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t el = sizeof ep;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &el);
    tp_wire_peer_t peer;
    cr_assert_eq(tp_wire_probe_peer(ep, 2000, NULL, &peer), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(peer.job, "job-D");
    cr_assert_str_eq(peer.comps, "image:uint8[64,28,28];label:int32[64]");
    /* a tcp sender's address, as the receiver names it */
    void *push = zmq_socket(ctx, ZMQ_PUSH);
    cr_assert_eq(zmq_connect(push, ep), 0);
    zmq_send(push, "x", 1, 0);
    int timeout = 5000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    tp_wire_msg_t *m = tp_wire_msg_new();
    cr_assert_eq(tp_wire_msg_recv(m, pull, 0), TP_OK);
    cr_assert_str_eq(tp_wire_msg_frame_peer(m, 0), "127.0.0.1");
    tp_wire_msg_destroy(&m);
    zmq_close(push);
    void *anon = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(zmq_bind(anon, "tcp://127.0.0.1:*"), 0);
    el = sizeof ep;
    zmq_getsockopt(anon, ZMQ_LAST_ENDPOINT, ep, &el);
    cr_assert_eq(tp_wire_probe_peer(ep, 2000, NULL, &peer), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(peer.comps, "");
    cr_assert_str_eq(peer.job, "");
    zmq_close(pull);
    zmq_close(anon);
    zmq_ctx_term(ctx);
}

Test(wire, a_tcp_endpoint_splits_into_host_and_port) {
    char host[64];
    const char *port = NULL;
    cr_assert_eq(tp_wire_tcp_host("tcp://10.0.0.7:5555", host, sizeof host, &port), 0);
    cr_expect_str_eq(host, "10.0.0.7");
    cr_expect_str_eq(port, "5555");
    cr_assert_eq(tp_wire_tcp_host("tcp://[::1]:7000", host, sizeof host, &port), 0);
    cr_expect_str_eq(host, "::1", "the brackets dropped");
    cr_expect_str_eq(port, "7000");
    cr_expect_eq(tp_wire_tcp_host("ipc:///tmp/a.sock", host, sizeof host, &port), -1);
    cr_expect_eq(tp_wire_tcp_host("tcp://eth0;10.0.0.7:5555", host, sizeof host, &port), -1,
                 "an interface part");
    cr_expect_eq(tp_wire_tcp_host("tcp://nohost", host, sizeof host, &port), -1);
    cr_expect_eq(tp_wire_tcp_host("tcp://a-very-long-host-name:1", host, 8, &port), -1,
                 "longer than the buffer");
}

/* The probe at an address of the endpoint's host looks no name up: an
 * endpoint whose name never resolves (.invalid) still reads the receiver
 * at the address given. Another family's address, or an ipc endpoint, is
 * a clear error. */
Test(wire, the_probe_at_an_address_looks_no_name_up) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    cr_assert_eq(tp_wire_set_job(pull, "job-E"), TP_OK);
    cr_assert_eq(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    char ep[128], named[160];
    size_t el = sizeof ep;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &el);
    const char *port = strrchr(ep, ':') + 1;
    snprintf(named, sizeof named, "tcp://no-such-host.invalid:%s", port);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    tp_wire_peer_t peer;
    cr_assert_eq(tp_wire_probe_peer_at(named, (struct sockaddr *)&a, sizeof a, 2000, NULL,
                                       &peer), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(peer.job, "job-E");
    struct sockaddr_un u = {.sun_family = AF_UNIX};
    cr_assert_eq(tp_wire_probe_peer_at(named, (struct sockaddr *)&u, sizeof u, 2000, NULL,
                                       &peer), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "must be an IPv4 or IPv6 one of a tcp:// endpoint"),
              "%s", tp_last_error());
    cr_assert_eq(tp_wire_probe_peer_at("ipc:///tmp/x.sock", (struct sockaddr *)&a, sizeof a,
                                       2000, NULL, &peer), TP_ERR_INVALID);
    zmq_close(pull);
    zmq_ctx_term(ctx);
}
