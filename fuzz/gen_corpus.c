/* towerpack fuzzing: writes the seed corpora, fuzz/corpus/<target>/, as
 * real valid inputs made by the library's own encoders (and the IDX and
 * gzip writers of fuzz_files.h). Deterministic: the same files every run.
 *
 *   gen_corpus DIR      (scripts/fuzz.sh --regen runs it on fuzz/corpus)
 *
 * The frame layout of the wire and lmdb targets is described at the top
 * of fuzz_wire.c and fuzz_lmdb.c. */
#include <errno.h>
#include <tiffio.h>
#include <unistd.h>
#include <webp/encode.h>
#include <sys/stat.h>
#include "fuzz_common.h"
#include "fuzz_files.h"
#include "fuzz_model.h"

static const char *s_root;

__attribute__((noreturn)) static void s_die(const char *what) {
    fprintf(stderr, "gen_corpus: %s: %s\n", what, tp_last_error());
    exit(1);
}

static void s_mkdir(const char *target) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", s_root, target);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        perror(p);
        exit(1);
    }
}

static void s_put(const char *target, const char *name, const void *data,
                  size_t size) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s/%s", s_root, target, name);
    if (!fuzz_write_file(p, data, size)) {
        perror(p);
        exit(1);
    }
}

/* A datapoint of ncomp components with the given dtypes and shapes, its
 * bytes a deterministic pattern (compressible when `smooth`). */
static tp_datapoint_t *s_dp(int ncomp, const tp_dtype_t *dt, const int *nd,
                            const int64_t (*shape)[TP_MAX_DIMS], int smooth) {
    tp_datapoint_t *dp = tp_datapoint_new(ncomp);
    if (!dp)
        s_die("datapoint");
    for (int i = 0; i < ncomp; i++) {
        tp_tensor_t *t = tp_datapoint_get(dp, i);
        if (tp_tensor_init(t, dt[i], nd[i], shape[i]) != TP_OK)
            s_die("tensor");
        uint8_t *b = t->data;
        for (size_t k = 0; k < t->nbytes; k++)
            b[k] = (uint8_t)(smooth ? k / 64 : k * 131 + i);
    }
    return dp;
}

/* ---- wire: option byte, then [u32 length][frame] ... ---------------------- */

static void s_wire(const char *name, uint8_t opt, tp_datapoint_t *dp,
                   int lz4, int checksum) {
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    o.lz4 = lz4;
    o.lz4_min_bytes = 16;
    o.checksum = checksum;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (!msg || tp_wire_encode(&dp, &o, msg) != TP_OK)
        s_die("wire encode");
    size_t total = 1 + tp_wire_msg_bytes(msg) + 4 * (size_t)tp_wire_msg_frames(msg);
    uint8_t *buf = malloc(total), *p = buf;
    *p++ = opt;
    for (int i = 0; i < tp_wire_msg_frames(msg); i++) {
        uint32_t n = (uint32_t)tp_wire_msg_frame_size(msg, i);
        memcpy(p, &n, 4);
        memcpy(p + 4, tp_wire_msg_frame_data(msg, i), n);
        p += 4 + n;
    }
    s_put("wire", name, buf, total);
    free(buf);
    tp_wire_msg_destroy(&msg);
}

/* ---- lmdb: option byte (bit 0: chunk), then the value ------------------- */

static void *s_record(tp_datapoint_t *dp, int lz4, int checksum, size_t *n) {
    tp_records_opts_t o;
    tp_records_opts_init(&o);
    o.lz4 = lz4;
    o.lz4_min_bytes = 16;
    o.checksum = checksum;
    void *v = NULL;
    if (tp_records_encode(dp, &o, &v, n) != TP_OK)
        s_die("records encode");
    return v;
}

static void s_lmdb_record(const char *name, uint8_t opt, tp_datapoint_t *dp,
                          int lz4, int checksum) {
    size_t n;
    uint8_t *v = s_record(dp, lz4, checksum, &n);
    uint8_t *buf = malloc(n + 1);
    buf[0] = opt;
    memcpy(buf + 1, v, n);
    s_put("lmdb", name, buf, n + 1);
    free(buf);
    free(v);
}

/* A chunk of k records as tp_records_save writes it: u32 k, u32 ends[k],
 * the records back to back; preceded by the option byte and k. */
static void s_lmdb_chunk(const char *name, tp_datapoint_t **dps, int k) {
    size_t cap = 2 + 4 + 4 * (size_t)k, n = cap;
    uint8_t *buf = malloc(cap);
    buf[0] = 1;
    buf[1] = (uint8_t)k;
    uint32_t nk = (uint32_t)k, end = 0;
    memcpy(buf + 2, &nk, 4);
    for (int j = 0; j < k; j++) {
        size_t rn;
        uint8_t *v = s_record(dps[j], j % 2, 0, &rn);
        buf = realloc(buf, n + rn);
        memcpy(buf + n, v, rn);
        n += rn;
        end += (uint32_t)rn;
        memcpy(buf + 6 + 4 * j, &end, 4);
        free(v);
    }
    s_put("lmdb", name, buf, n);
    free(buf);
}

static void s_wire_and_lmdb(void) {
    s_mkdir("wire");
    s_mkdir("lmdb");
    /* Fashion-MNIST-like: uint8 [28,28] image and an int32 label */
    const tp_dtype_t d1[2] = {TP_UINT8, TP_INT32};
    const int n1[2] = {2, 0};
    const int64_t s1[2][TP_MAX_DIMS] = {{28, 28}, {0}};
    /* every other dtype, an empty tensor, a 4-d one */
    const tp_dtype_t d2[5] = {TP_FLOAT32, TP_FLOAT16, TP_INT64, TP_FLOAT64,
                              TP_BFLOAT16};
    const int n2[5] = {2, 1, 1, 4, 0};
    const int64_t s2[5][TP_MAX_DIMS] = {{4, 3}, {0}, {5}, {1, 2, 2, 1}, {0}};
    const tp_dtype_t d3[1] = {TP_FLOAT32};
    const int n3[1] = {1};
    const int64_t s3[1][TP_MAX_DIMS] = {{64}};

    s_wire("fmnist_plain", 0, s_dp(2, d1, n1, s1, 0), 0, 0);
    s_wire("fmnist_lz4_crc", 6, s_dp(2, d1, n1, s1, 1), 1, 1);
    s_wire("dtypes", 0, s_dp(5, d2, n2, s2, 0), 0, 0);
    s_wire("dtypes_crc_limit", 5, s_dp(5, d2, n2, s2, 0), 0, 1);
    s_wire("lz4_smooth", 2, s_dp(1, d3, n3, s3, 1), 1, 0);
    s_wire("empty", 0, s_dp(0, NULL, NULL, NULL, 0), 0, 0);

    tp_datapoint_t *a = s_dp(2, d1, n1, s1, 0), *b = s_dp(5, d2, n2, s2, 0),
                   *c = s_dp(1, d3, n3, s3, 1), *e = s_dp(0, NULL, NULL, NULL, 0);
    s_lmdb_record("fmnist_plain", 0, a, 0, 0);
    s_lmdb_record("fmnist_lz4_crc", 6, a, 1, 1);
    s_lmdb_record("dtypes", 0, b, 0, 0);
    s_lmdb_record("dtypes_crc", 4, b, 0, 1);
    s_lmdb_record("lz4_smooth", 2, c, 1, 0);
    s_lmdb_record("empty", 0, e, 0, 0);
    tp_datapoint_t *chunk[3] = {a, c, b};
    s_lmdb_chunk("chunk3", chunk, 3);
    s_lmdb_chunk("chunk1", chunk, 1);
    s_lmdb_chunk("chunk0", chunk, 0);
    tp_datapoint_destroy(&a);
    tp_datapoint_destroy(&b);
    tp_datapoint_destroy(&c);
    tp_datapoint_destroy(&e);
}

/* ---- idx: plain and gzip'd IDX files ------------------------------------- */

static void s_idx_one(const char *name, uint8_t type, int ndim,
                      const uint32_t *dims, const void *payload, size_t elem,
                      int gz) {
    uint8_t *b, *z;
    size_t n, zn;
    if (!fuzz_idx_make(type, ndim, dims, payload, elem, &b, &n))
        s_die("idx");
    if (gz) {
        if (!fuzz_gzip(b, n, &z, &zn))
            s_die("gzip");
        s_put("idx", name, z, zn);
        free(z);
    } else {
        s_put("idx", name, b, n);
    }
    free(b);
}

static void s_idx(void) {
    s_mkdir("idx");
    uint8_t img[3 * 4 * 4];
    for (size_t i = 0; i < sizeof img; i++)
        img[i] = (uint8_t)(i * 5);
    int32_t lab[5] = {0, 1, -2, 70000, 9};
    float f[6] = {0.5f, -1.0f, 3.25f, 0.0f, 1e-3f, 42.0f};
    double d[2] = {3.141592653589793, -2.5};
    const uint32_t di[3] = {3, 4, 4}, dl[1] = {5}, df[2] = {2, 3}, dd[1] = {2},
                   dz[2] = {0, 7};
    s_idx_one("images_u8", 0x08, 3, di, img, 1, 0);
    s_idx_one("labels_i32", 0x0C, 1, dl, lab, 4, 0);
    s_idx_one("floats_f32", 0x0D, 2, df, f, 4, 0);
    s_idx_one("doubles_f64", 0x0E, 1, dd, d, 8, 0);
    s_idx_one("empty_u8", 0x08, 2, dz, img, 1, 0);
    s_idx_one("images_u8.gz", 0x08, 3, di, img, 1, 1);
    s_idx_one("labels_i32.gz", 0x0C, 1, dl, lab, 4, 1);
}

/* ---- safetensors: a plain file and a model checkpoint --------------------- */

static void s_safetensors(void) {
    s_mkdir("safetensors");
    char tmp[] = "/tmp/tp-gen-corpus-XXXXXX";
    if (!mkdtemp(tmp))
        s_die("mkdtemp");
    char path[128];
    uint8_t *b;
    size_t n;

    tp_tensor_t t[3];
    int64_t s0[2] = {2, 3}, s1[1] = {4};
    tp_tensor_init(&t[0], TP_FLOAT32, 2, s0);
    tp_tensor_init(&t[1], TP_INT64, 1, s1);
    tp_tensor_init(&t[2], TP_UINT8, 0, NULL);
    for (int i = 0; i < 3; i++)
        for (size_t k = 0; k < t[i].nbytes; k++)
            ((uint8_t *)t[i].data)[k] = (uint8_t)(k * 3 + i);
    tp_named_tensor_t nt[3] = {{"a/w", &t[0]}, {"b", &t[1]}, {"scalar", &t[2]}};
    tp_meta_kv_t meta[1] = {{"note", "a seed"}};
    snprintf(path, sizeof path, "%s/plain.safetensors", tmp);
    if (tp_safetensors_write(path, nt, 3, meta, 1) != TP_OK ||
        !fuzz_read_file(path, &b, &n))
        s_die("safetensors");
    s_put("safetensors", "plain", b, n);
    free(b);
    unlink(path);
    snprintf(path, sizeof path, "%s/none.safetensors", tmp);
    if (tp_safetensors_write(path, NULL, 0, NULL, 0) != TP_OK ||
        !fuzz_read_file(path, &b, &n))
        s_die("safetensors");
    s_put("safetensors", "no_tensors", b, n);
    free(b);
    unlink(path);
    for (int i = 0; i < 3; i++)
        tp_tensor_fini(&t[i]);

    tp_model_t *m = fuzz_model_new();
    if (!m)
        s_die("model");
    tp_train_state_t st;
    memset(&st, 0, sizeof st);
    st.epoch = 3;
    st.global_step = 120;
    tp_rng_init(&st.rng, 11, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (tp_checkpoint_save(m, path, &st) != TP_OK ||
        !fuzz_read_file(path, &b, &n))
        s_die("checkpoint");
    s_put("safetensors", "checkpoint", b, n);
    free(b);
    unlink(path);
    /* with the model's name and inputs in the metadata (tp_checkpoint_info) */
    if (tp_model_set_name(m, "fuzz") != TP_OK || tp_checkpoint_save(m, path, &st) != TP_OK ||
        !fuzz_read_file(path, &b, &n))
        s_die("checkpoint");
    s_put("safetensors", "checkpoint_named", b, n);
    free(b);
    unlink(path);
    tp_model_destroy(&m);
    rmdir(tmp);
}

/* ---- spec: pipeline strings ----------------------------------------------- */

static void s_spec(void) {
    s_mkdir("spec");
    static const char *specs[] = {
        "fashion-mnist:train | shuffle 10000 | augment crop=28,pad=2,flip | "
        "batch 128",
        "fashion-mnist:test,shuffle=0 | batch 256 remainder",
        "fake:shape=28x28:uint8,shape=scalar:int32,size=100 | batch 8",
        "fake:shape=3x32x32,size=10,random=0,dtype=float16 | repeat 2 | "
        "cache shuffle",
        "idx:img.idx,lab.idx | map-threads 2 strict buffer=16 augment "
        "mean=0.5/0.4/0.3,std=0.2/0.2/0.2,component=0 | fixed-size 5",
        "lmdb:tiny.lmdb,shuffle=1 | select 1 0 | print 2",
        "fake | shuffle 100 reuse=2 interval=10 | repeat forever",
        "fake:const | augment crop=20x24,flip=0.25 | batch 4",
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        char name[32];
        snprintf(name, sizeof name, "spec%zu", i);
        s_put("spec", name, specs[i], strlen(specs[i]));
    }
}

/* ---- stats: snapshots as a publisher sends them --------------------------- */

static void s_stats_one(const char *name, int nrows) {
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    snprintf(snap.source, sizeof snap.source, "supervisor");
    snap.pid = 4242;
    snap.seq = 17;
    snap.wall_s = 1790000000.25;
    snap.interval_s = 1.0;
    snap.nrows = nrows;
    snap.rows = nrows ? calloc((size_t)nrows, sizeof *snap.rows) : NULL;
    static const char *names[] = {"source", "map-threads", "tower0", "feed"};
    for (int i = 0; i < nrows; i++) {
        tp_stats_row_t *r = &snap.rows[i];
        snprintf(r->name, sizeof r->name, "%s", names[i % 4]);
        r->state = (uint8_t)(i % TP_ACTOR_STATE_COUNT);
        r->restarts = (uint32_t)i;
        r->msgs_in = 1000u * (uint64_t)i;
        r->msgs_out = 990u * (uint64_t)i;
        r->bytes_in = r->msgs_in * 800;
        r->bytes_out = r->msgs_out * 800;
        r->busy_s = 0.5 * i;
        r->starved_s = 0.1;
        r->blocked_s = 0.2 * i;
        r->alive_s = 10;
        r->queue_fill = i % 2 ? -1.0 : 0.25 * i;
        if (i == 3)  /* a remote sender's row: its addresses */
            snprintf(r->where, sizeof r->where, ">tcp://10.0.0.1:5550");
        tp_stats_row_rates(r, NULL, 10);
    }
    void *buf;
    size_t n;
    if (tp_stats_encode(&snap, &buf, &n) != TP_OK)
        s_die("stats encode");
    s_put("stats", name, buf, n);
    free(buf);
    tp_stats_snapshot_fini(&snap);
}

static void s_stats(void) {
    s_mkdir("stats");
    s_stats_one("rows0", 0);
    s_stats_one("rows1", 1);
    s_stats_one("rows4", 4);
}

/* ---- tensorpack's messages: what towerpack's encoders write, and the
 * protocol 2 spellings Python uses (_reconstruct, _codecs.encode) ------- */
static void s_tensorpack(void) {
    static const char *const dirs[] = {"pickle", "msgpack", "zmq_ops"};
    static const tp_tpk_format_t fmts[] = {TP_TPK_PICKLE, TP_TPK_MSGPACK, TP_TPK_ZMQ_OPS};
    tp_dtype_t d1[2] = {TP_UINT8, TP_INT64};
    int n1[2] = {3, 1};
    int64_t s1[2][TP_MAX_DIMS] = {{2, 4, 4}, {2}};
    tp_dtype_t d2[5] = {TP_INT32, TP_FLOAT16, TP_FLOAT32, TP_FLOAT64, TP_INT64};
    int n2[5] = {1, 2, 0, 1, 0};
    int64_t s2[5][TP_MAX_DIMS] = {{3}, {2, 2}, {0}, {2}, {0}};
    for (int f = 0; f < 3; f++) {
        s_mkdir(dirs[f]);
        for (int k = 0; k < 2; k++) {
            tp_datapoint_t *dp = k ? s_dp(5, d2, n2, s2, 0) : s_dp(2, d1, n1, s1, 0);
            void *buf;
            size_t len;
            if (tp_tpk_encode(dp, fmts[f], &buf, &len) != TP_OK)
                s_die("tensorpack encode");
            s_put(dirs[f], k ? "dtypes" : "image_label", buf, len);
            free(buf);
            tp_datapoint_destroy(&dp);
        }
    }
    /* what Python writes for pickle.dumps([np.arange(3, dtype=np.uint8), 7,
     * 2.5, b'ab', b''], protocol=2) */
    static const char p2[] =
        "\200\002]q\000(cnumpy.core.multiarray\012_reconstruct\012q\001cnumpy\012"
        "ndarray\012q\002K\000\205q\003c_codecs\012encode\012q\004X\001\000\000"
        "\000bq\005X\006\000\000\000latin1q\006\206q\007Rq\010\207q\011Rq\012(K"
        "\001K\003\205q\013cnumpy\012dtype\012q\014X\002\000\000\000u1q\015\211"
        "\210\207q\016Rq\017(K\003X\001\000\000\000|q\020NNNJ\377\377\377\377J"
        "\377\377\377\377K\000tq\021b\211h\004X\003\000\000\000\000\001\002q\022h"
        "\006\206q\023Rq\024tq\025bK\007G@\004\000\000\000\000\000\000h\004X\002"
        "\000\000\000abq\026h\006\206q\027Rq\030c__builtin__\012bytes\012q\031)Rq"
        "\032e.";
    s_put("pickle", "protocol2", p2, sizeof p2 - 1);
    /* a __keys__ list */
    static const char keys[] = "\200\005](C\01000000000C\01000000001e.";
    s_put("pickle", "keys", keys, sizeof keys - 1);
}

/* ---- image: small JPEGs (grey, colour) and PNGs (each channel count) --- */

static void s_image(void) {
    s_mkdir("image");
    for (int c = 1; c <= 4; c++) {
        int64_t shape[3] = {9, 13, c};
        tp_tensor_t t;
        if (tp_tensor_init(&t, TP_UINT8, c == 1 ? 2 : 3, shape) != TP_OK)
            s_die("image");
        for (size_t i = 0; i < t.nbytes; i++)
            ((uint8_t *)t.data)[i] = (uint8_t)(i * 7);
        void *d;
        size_t n;
        char name[32];
        if (c != 2) {
            if (tp_image_encode_png(&t, &d, &n) != TP_OK)
                s_die("image png");
            snprintf(name, sizeof name, "c%d.png", c);
            s_put("image", name, d, n);
            free(d);
        }
        if (c == 1 || c == 3) {
            if (tp_image_encode_jpeg(&t, 80, &d, &n) != TP_OK)
                s_die("image jpeg");
            snprintf(name, sizeof name, "c%d.jpg", c);
            s_put("image", name, d, n);
            if (c == 3) {
                /* the same JPEG with an Exif APP1 segment: orientation 6
                 * (big-endian TIFF, one IFD entry) */
                static const uint8_t app1[] = {
                    0xFF, 0xE1, 0x00, 0x22, 'E', 'x', 'i', 'f', 0, 0,
                    'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1,
                    0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0,
                    0, 0, 0, 0};
                uint8_t *e = malloc(n + sizeof app1);
                if (!e)
                    s_die("image exif");
                memcpy(e, d, 2);
                memcpy(e + 2, app1, sizeof app1);
                memcpy(e + 2 + sizeof app1, (uint8_t *)d + 2, n - 2);
                s_put("image", "exif6.jpg", e, n + sizeof app1);
                free(e);
            }
            free(d);
        }
        tp_tensor_fini(&t);
    }
}

/* ---- image: the other formats (WebP, TIFF, BMP, PGM/PPM) -------------------- */

static void s_le(uint8_t *p, uint32_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A BMP of w x h: 24-bit, 8-bit with a grey ramp palette, 4-bit with a
 * colour palette, 16 or 32-bit; rows bottom-up, or top-down (negative
 * height). A header of hs bytes (40, or a V4/V5 one of 108/124) and
 * compression comp (0, or 3: the bit-field masks after a 40-byte header,
 * inside a V4/V5 one, with its alpha mask). */
static void s_bmp(const char *name, int w, int h, int bpp, int topdown, int hs,
                  int comp, const uint32_t masks[4]) {
    int npal = bpp <= 8 ? 1 << bpp : 0, stride = (w * bpp + 31) / 32 * 4;
    int extra = hs == 40 && comp == 3 ? 12 : 0;
    size_t off = 14 + (size_t)hs + extra + (size_t)npal * 4,
           n = off + (size_t)stride * h;
    uint8_t *b = calloc(1, n);
    if (!b)
        s_die("image bmp");
    b[0] = 'B', b[1] = 'M';
    s_le(b + 2, (uint32_t)n, 4);
    s_le(b + 10, (uint32_t)off, 4);
    s_le(b + 14, (uint32_t)hs, 4);
    s_le(b + 18, (uint32_t)w, 4);
    s_le(b + 22, (uint32_t)(topdown ? -h : h), 4);
    s_le(b + 26, 1, 2);
    s_le(b + 28, (uint32_t)bpp, 2);
    s_le(b + 30, (uint32_t)comp, 4);
    if (comp == 3)  /* at 54 both after a 40-byte header and in a V4/V5 one */
        for (int k = 0; k < (hs > 40 ? 4 : 3); k++)
            s_le(b + 54 + 4 * k, masks[k], 4);
    uint8_t *pal = b + 14 + hs + extra;
    for (int i = 0; i < npal; i++) {
        int grey = bpp == 8;
        pal[i * 4] = (uint8_t)(grey ? i : i * 17);
        pal[i * 4 + 1] = (uint8_t)(grey ? i : 255 - i * 13);
        pal[i * 4 + 2] = (uint8_t)(grey ? i : i * 40);
    }
    for (size_t i = off; i < n; i++)
        b[i] = (uint8_t)(i * 5);
    s_put("image", name, b, n);
    free(b);
}

/* A run-length coded BMP of w x h (w >= 13; bpp 8: RLE8, 4: RLE4) with
 * a 16-colour palette, its stream using every escape: runs, absolute
 * runs of an odd count (their padding), end of line, a delta, end of
 * bitmap. */
static void s_bmp_rle(const char *name, int w, int h, int bpp) {
    uint8_t b[2048];
    size_t off = 14 + 40 + 16 * 4, k = off;
    for (int y = 0; y < h; y++) {
        uint8_t v = (uint8_t)(bpp == 4 ? (y & 15) * 0x11 : y & 15);
        if (y == 4) {  /* two pixels, then 3 right and one row on */
            uint8_t d[] = {2, v, 0, 2, 3, 1, (uint8_t)(w - 5), (uint8_t)(v ^ 0x21), 0, 0};
            memcpy(b + k, d, sizeof d);
            k += sizeof d;
            y++;
            continue;
        }
        b[k++] = 4, b[k++] = v;
        b[k++] = 0, b[k++] = 5;  /* an absolute run of 5 */
        for (int i = 0; i < (bpp == 4 ? 3 : 5); i++)
            b[k++] = (uint8_t)(i * 0x37 + y) & (bpp == 4 ? 0xFF : 15);
        if (k & 1)
            b[k++] = 0;
        b[k++] = (uint8_t)(w - 9), b[k++] = (uint8_t)(v ^ 0x12);
        b[k++] = 0, b[k++] = y == h - 1 ? 1 : 0;
    }
    memset(b, 0, off);
    b[0] = 'B', b[1] = 'M';
    s_le(b + 2, (uint32_t)k, 4);
    s_le(b + 10, (uint32_t)off, 4);
    s_le(b + 14, 40, 4);
    s_le(b + 18, (uint32_t)w, 4);
    s_le(b + 22, (uint32_t)h, 4);
    s_le(b + 26, 1, 2);
    s_le(b + 28, (uint32_t)bpp, 2);
    s_le(b + 30, bpp == 8 ? 1 : 2, 4);
    s_le(b + 46, 16, 4);
    for (int i = 0; i < 16; i++) {
        b[54 + i * 4] = (uint8_t)(i * 17);
        b[55 + i * 4] = (uint8_t)(255 - i * 13);
        b[56 + i * 4] = (uint8_t)(i * 40);
    }
    s_put("image", name, b, k);
}

/* A TIFF written by libtiff into a temporary file, then read back. */
static void s_tiff(const char *name, int spp, int photo, int comp) {
    char tmp[] = "/tmp/tp_gen_corpus_XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0)
        s_die("image tiff");
    close(fd);
    TIFF *t = TIFFOpen(tmp, "w");
    if (!t)
        s_die("image tiff open");
    enum { W = 11, H = 7 };
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, W);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, H);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, spp);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, photo);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
    TIFFSetField(t, TIFFTAG_COMPRESSION, comp);
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 3);
    if (photo == PHOTOMETRIC_YCBCR)  /* no subsampling: one sample each */
        TIFFSetField(t, TIFFTAG_YCBCRSUBSAMPLING, 1, 1);
    if (spp == 4 && photo != PHOTOMETRIC_SEPARATED) {
        uint16_t extra = EXTRASAMPLE_UNASSALPHA;
        TIFFSetField(t, TIFFTAG_EXTRASAMPLES, 1, &extra);
    }
    static uint16_t map[3][256];
    if (photo == PHOTOMETRIC_PALETTE) {
        for (int i = 0; i < 256; i++)
            map[0][i] = (uint16_t)(i * 257), map[1][i] = (uint16_t)((255 - i) * 257),
            map[2][i] = (uint16_t)((i * 3 & 255) * 257);
        TIFFSetField(t, TIFFTAG_COLORMAP, map[0], map[1], map[2]);
    }
    uint8_t row[W * 4];
    for (int y = 0; y < H; y++) {
        for (int i = 0; i < W * spp; i++)
            row[i] = (uint8_t)(i * 9 + y * 31);
        if (TIFFWriteScanline(t, row, (uint32_t)y, 0) < 0)
            s_die("image tiff row");
    }
    TIFFClose(t);
    FILE *f = fopen(tmp, "rb");
    static uint8_t buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    unlink(tmp);
    if (!n)
        s_die("image tiff read");
    s_put("image", name, buf, n);
}

static void s_image_formats(void) {
    enum { W = 13, H = 9 };
    static uint8_t px[W * H * 4];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(i * 7 + (i / 52) * 3);
    uint8_t *out = NULL;
    size_t n;
    if (!(n = WebPEncodeRGB(px, W, H, W * 3, 75, &out)))
        s_die("image webp");
    s_put("image", "lossy.webp", out, n);
    WebPFree(out);
    if (!(n = WebPEncodeRGBA(px, W, H, W * 4, 75, &out)))
        s_die("image webp alpha");
    s_put("image", "lossy_alpha.webp", out, n);
    WebPFree(out);
    if (!(n = WebPEncodeLosslessRGBA(px, W, H, W * 4, &out)))
        s_die("image webp lossless");
    s_put("image", "lossless.webp", out, n);
    WebPFree(out);
    s_tiff("rgb_lzw.tif", 3, PHOTOMETRIC_RGB, COMPRESSION_LZW);
    s_tiff("rgba.tif", 4, PHOTOMETRIC_RGB, COMPRESSION_NONE);
    s_tiff("grey_packbits.tif", 1, PHOTOMETRIC_MINISBLACK, COMPRESSION_PACKBITS);
    s_tiff("palette.tif", 1, PHOTOMETRIC_PALETTE, COMPRESSION_ADOBE_DEFLATE);
    static const uint32_t bgra[4] = {0xFF0000, 0xFF00, 0xFF, 0xFF000000},
                          rgb565[4] = {0xF800, 0x7E0, 0x1F, 0};
    s_bmp("rgb.bmp", W, H, 24, 0, 40, 0, NULL);
    s_bmp("grey_topdown.bmp", W, H, 8, 1, 40, 0, NULL);
    s_bmp("rgba_v5.bmp", W, H, 32, 0, 124, 3, bgra);
    s_bmp("rgb565.bmp", W, H, 16, 1, 40, 3, rgb565);
    s_bmp("rgb555.bmp", W, H, 16, 0, 40, 0, NULL);
    s_bmp("pal4.bmp", W, H, 4, 0, 40, 0, NULL);
    static const uint32_t zero[4] = {0, 0, 0, 0};  /* PIL: BGRA */
    s_bmp("zero_masks.bmp", W, H, 32, 0, 40, 3, zero);
    s_bmp_rle("rle8.bmp", W, H, 8);
    s_bmp_rle("rle4.bmp", W, H, 4);
    s_tiff("cmyk.tif", 4, PHOTOMETRIC_SEPARATED, COMPRESSION_NONE);
    s_tiff("ycbcr_lzw.tif", 3, PHOTOMETRIC_YCBCR, COMPRESSION_LZW);
    char hdr[32];
    int k = snprintf(hdr, sizeof hdr, "P6\n# seed\n%d %d\n255\n", W, H);
    uint8_t *p = malloc((size_t)k + sizeof px);
    if (!p)
        s_die("image pnm");
    memcpy(p, hdr, (size_t)k);
    memcpy(p + k, px, W * H * 3);
    s_put("image", "rgb.ppm", p, (size_t)k + W * H * 3);
    k = snprintf(hdr, sizeof hdr, "P5 %d %d 255\n", W, H);
    memcpy(p, hdr, (size_t)k);
    memcpy(p + k, px, W * H);
    s_put("image", "grey.pgm", p, (size_t)k + W * H);
    free(p);
}

/* ---- comps: the component handshake's text ------------------------------ */
static void s_comps(void) {
    static const struct { const char *name, *text; } seeds[] = {
        {"fmnist", "image:uint8[64,28,28];label:int32[64]{0..9}"},
        {"any_batch", "image:float32[*,3,224,224];label:int32[*]{0..999}"},
        {"scalar", "x:int64[]"},
        {"text", "tokens:int32[8,257]{0..255};mask:uint8[8,257]"},
    };
    s_mkdir("comps");
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        s_put("comps", seeds[i].name, seeds[i].text, strlen(seeds[i].text));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus DIR (writes DIR/<target>/...)\n");
        return 2;
    }
    fuzz_quiet();
    s_root = argv[1];
    if (mkdir(s_root, 0755) != 0 && errno != EEXIST) {
        perror(s_root);
        return 1;
    }
    s_wire_and_lmdb();
    s_idx();
    s_safetensors();
    s_spec();
    s_stats();
    s_tensorpack();
    s_image();
    s_image_formats();
    s_comps();
    return 0;
}
