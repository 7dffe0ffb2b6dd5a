/* towerpack dataflow: LMDB files written by tensorpack's LMDBSerializer.save,
 * read as they are (the source tensorpack-lmdb:PATH[,shuffle]), and written
 * in the same layout (tp_tpk_lmdb_save, tp-bench tensorpack-lmdb).
 *
 * The layout: an LMDB file (subdir=False) or a directory holding data.mdb;
 * keys '%08d' of the datapoint's index, values dumps(datapoint) (pickle or
 * msgpack), and "__keys__" = dumps(list of the keys as bytes). Read in
 * order, it is every key but "__keys__" in key order (LMDBData with
 * shuffle=False walks the cursor); shuffled, the keys of "__keys__" (or,
 * when it is missing, every key found by the cursor) in a new order each
 * pass, each looked up (LMDBData with shuffle=True). Values are untrusted
 * and decoded by tp_tpk_decode (copied: the map is valid only during a
 * read transaction). */
#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "df_internal.h"
#include "df_tp.h"

#define KEYS_KEY "__keys__"

typedef struct {
    char *path;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;
    MDB_cursor *cur;
    int shuffle, started;
    tp_tpk_opts_t opts;
    size_t count;         /* datapoints */
    char *keys;           /* shuffled: the keys, back to back */
    size_t *offs, *lens;
    uint32_t *order;
    size_t pos;
    tp_rng_t rng;
} s_tl_t;

static tp_status_t s_mdb(int err, const char *path, const char *what) {
    return tp_error(err == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_FORMAT,
                    "tensorpack-lmdb %s: %s: %s", path, what, mdb_strerror(err));
}

static void s_end(s_tl_t *s) {
    if (s->cur)
        mdb_cursor_close(s->cur);
    if (s->txn)
        mdb_txn_abort(s->txn);
    s->cur = NULL;
    s->txn = NULL;
    s->started = 0;
}

static tp_status_t s_reset(void *impl, tp_rng_t *rng, uint64_t seed, uint64_t stream) {
    (void)rng;
    s_tl_t *s = impl;
    tp_df_rng_derive(&s->rng, seed, stream, "tensorpack-lmdb");
    return TP_OK;
}

static tp_status_t s_begin(void *impl) {
    s_tl_t *s = impl;
    s_end(s);
    int err = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &s->txn);
    if (!err)
        err = mdb_cursor_open(s->txn, s->dbi, &s->cur);
    if (err) {
        s_end(s);
        return s_mdb(err, s->path, "begin a read");
    }
    if (s->shuffle)
        df_iota_shuffle(s->order, s->count, &s->rng);
    s->pos = 0;
    s->started = 1;
    return TP_OK;
}

static int s_is_keys(const MDB_val *k) {
    return k->mv_size == strlen(KEYS_KEY) && !memcmp(k->mv_data, KEYS_KEY, k->mv_size);
}

static tp_status_t s_next(void *impl, tp_datapoint_t **out) {
    s_tl_t *s = impl;
    if (!s->started)
        TP_TRY(s_begin(s));
    MDB_val k, v;
    int err;
    if (s->shuffle) {
        if (s->pos >= s->count) {
            s_end(s);
            return TP_DONE;
        }
        size_t i = s->order[s->pos];
        k.mv_size = s->lens[i];
        k.mv_data = s->keys + s->offs[i];
        err = mdb_get(s->txn, s->dbi, &k, &v);
        if (err)
            return tp_error(TP_ERR_FORMAT, "tensorpack-lmdb %s: key '%.*s' of "
                            "__keys__: %s", s->path, (int)(k.mv_size < 64 ? k.mv_size : 64),
                            (const char *)k.mv_data, mdb_strerror(err));
    } else {  /* the cursor's order, skipping __keys__ */
        MDB_cursor_op op = s->pos == 0 ? MDB_FIRST : MDB_NEXT;
        while (!(err = mdb_cursor_get(s->cur, &k, &v, op)) && s_is_keys(&k))
            op = MDB_NEXT;
        if (err == MDB_NOTFOUND) {
            s_end(s);
            return TP_DONE;
        }
        if (err)
            return s_mdb(err, s->path, "read");
    }
    s->pos++;
    tp_status_t rc = tp_tpk_decode(v.mv_data, v.mv_size, &s->opts, NULL, NULL, out);
    if (rc != TP_OK)
        return tp_error_wrap(rc, "tensorpack-lmdb %s: value of key '%.*s'", s->path,
                             (int)(k.mv_size < 64 ? k.mv_size : 64),
                             (const char *)k.mv_data);
    return TP_OK;
}

static int64_t s_size(void *impl) { return (int64_t)((s_tl_t *)impl)->count; }

static void s_end_pass(void *impl) { s_end(impl); }

static void s_destroy(void *impl) {
    s_tl_t *s = impl;
    s_end(s);
    if (s->env)
        mdb_env_close(s->env);
    free(s->path);
    free(s->keys);
    free(s->offs);
    free(s->lens);
    free(s->order);
    free(s);
}

static const tp_dataflow_ops_t s_ops = {
    .name = "tensorpack-lmdb", .reset_state = s_reset, .begin = s_begin,
    .next = s_next, .size = s_size, .destroy = s_destroy, .end_pass = s_end_pass};

/* Shuffled without __keys__: every key the cursor finds. */
static tp_status_t s_scan_keys(s_tl_t *s, MDB_txn *txn) {
    MDB_cursor *c;
    int err = mdb_cursor_open(txn, s->dbi, &c);
    if (err)
        return s_mdb(err, s->path, "cursor");
    size_t n = 0, total = 0, cap = 0, kcap = 0;
    MDB_val k, v;
    tp_status_t rc = TP_OK;
    for (err = mdb_cursor_get(c, &k, &v, MDB_FIRST); !err;
         err = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        if (s_is_keys(&k))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            size_t *o = realloc(s->offs, cap * sizeof *o);
            if (o)
                s->offs = o;
            size_t *l = o ? realloc(s->lens, cap * sizeof *l) : NULL;
            if (l)
                s->lens = l;
            if (!o || !l) {
                rc = tp_error(TP_ERR_NOMEM, "tensorpack-lmdb: keys");
                break;
            }
        }
        if (kcap - total < k.mv_size) {
            kcap = (kcap + k.mv_size) * 2;
            char *q = realloc(s->keys, kcap);
            if (!q) {
                rc = tp_error(TP_ERR_NOMEM, "tensorpack-lmdb: keys");
                break;
            }
            s->keys = q;
        }
        memcpy(s->keys + total, k.mv_data, k.mv_size);
        s->offs[n] = total;
        s->lens[n++] = k.mv_size;
        total += k.mv_size;
    }
    mdb_cursor_close(c);
    if (rc == TP_OK && err != MDB_NOTFOUND)
        rc = s_mdb(err, s->path, "read the keys");
    s->count = n;
    return rc;
}

tp_dataflow_t *tp_df_tensorpack_lmdb(const char *path, int shuffle,
                                     const tp_tpk_opts_t *opts) {
    if (!path) {
        tp_error(TP_ERR_INVALID, "tensorpack-lmdb: no path");
        return NULL;
    }
    s_tl_t *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        tp_error(TP_ERR_NOMEM, "tensorpack-lmdb");
        return NULL;
    }
    s->shuffle = shuffle;
    if (opts)
        s->opts = *opts;
    else
        tp_tpk_opts_init(&s->opts);
    MDB_txn *txn = NULL;
    struct stat st;
    char data[4200];
    int isdir = 0;
    if (stat(path, &st) != 0) {
        tp_error(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO,
                 "tensorpack-lmdb %s: %s", path, strerror(errno));
        goto fail;
    }
    isdir = S_ISDIR(st.st_mode);
    snprintf(data, sizeof data, "%s%s", path, isdir ? "/data.mdb" : "");
    if (isdir && stat(data, &st) != 0) {
        tp_error(TP_ERR_NOT_FOUND, "tensorpack-lmdb %s: a directory without data.mdb",
                 path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        tp_error(TP_ERR_IO, "tensorpack-lmdb %s: not a file or a directory", path);
        goto fail;
    }
    int err = mdb_env_create(&s->env);
    if (!err)
        err = mdb_env_open(s->env, path, MDB_RDONLY | MDB_NOLOCK | (isdir ? 0 : MDB_NOSUBDIR),
                           0644);
    if (err) {
        s_mdb(err == EINVAL ? MDB_INVALID : err, path, "open");
        goto fail;
    }
    /* A truncated file would fault when LMDB touches a page past its end. */
    MDB_envinfo info;
    MDB_stat mst;
    mdb_env_info(s->env, &info);
    mdb_env_stat(s->env, &mst);
    uint64_t need = ((uint64_t)info.me_last_pgno + 1) * mst.ms_psize;
    if ((uint64_t)st.st_size < need) {
        tp_error(TP_ERR_FORMAT, "tensorpack-lmdb %s: truncated (%lld bytes, its pages "
                 "need %" PRIu64 ")", path, (long long)st.st_size, need);
        goto fail;
    }
    if ((err = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn)) ||
        (err = mdb_dbi_open(txn, NULL, 0, &s->dbi))) {
        s_mdb(err, path, "begin a read");
        goto fail;
    }
    MDB_stat dst;
    mdb_stat(txn, s->dbi, &dst);
    MDB_val k = {strlen(KEYS_KEY), KEYS_KEY}, v;
    int has_keys = mdb_get(txn, s->dbi, &k, &v) == 0;
    s->count = dst.ms_entries - (has_keys ? 1 : 0);
    if (shuffle) {
        if (has_keys) {
            size_t n;
            if (df_tpk_keys(v.mv_data, v.mv_size, &s->keys, &s->offs, &s->lens, &n) != TP_OK) {
                tp_error_wrap(TP_ERR_FORMAT, "tensorpack-lmdb %s: %s", path, KEYS_KEY);
                goto fail;
            }
            s->count = n;
        } else if (s_scan_keys(s, txn) != TP_OK) {
            goto fail;
        }
        if (s->count > UINT32_MAX) {
            tp_error(TP_ERR_FORMAT, "tensorpack-lmdb %s: %zu keys", path, s->count);
            goto fail;
        }
        if (!(s->order = calloc(s->count ? s->count : 1, sizeof *s->order))) {
            tp_error(TP_ERR_NOMEM, "tensorpack-lmdb %s: order", path);
            goto fail;
        }
    }
    mdb_txn_abort(txn);
    return df_make(&s_ops, s);
fail:
    if (txn)
        mdb_txn_abort(txn);
    s_destroy(s);
    return NULL;
}

/* ---- the spec source: tensorpack-lmdb:PATH[,shuffle][,int32] ---------------- */

tp_status_t df_tpk_lmdb_spec(const char *args, void *user, tp_dataflow_t **out);
tp_status_t df_tpk_lmdb_spec(const char *args, void *user, tp_dataflow_t **out) {
    (void)user;
    char path[4096];
    const char *comma = strchr(args, ',');
    size_t plen = comma ? (size_t)(comma - args) : strlen(args);
    if (plen == 0 || plen >= sizeof path)
        return tp_error(TP_ERR_INVALID, "tensorpack-lmdb: give a PATH");
    memcpy(path, args, plen);
    path[plen] = '\0';
    int shuffle = 0;
    tp_tpk_opts_t o;
    tp_tpk_opts_init(&o);
    while (comma) {
        const char *p = comma + 1;
        comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        if ((l == 7 && !strncmp(p, "shuffle", 7)) || (l == 9 && !strncmp(p, "shuffle=1", 9)))
            shuffle = 1;
        else if (l == 9 && !strncmp(p, "shuffle=0", 9))
            shuffle = 0;
        else if (l == 5 && !strncmp(p, "int32", 5))
            o.int32_labels = 1;
        else
            return tp_error(TP_ERR_INVALID, "tensorpack-lmdb: option '%.*s' (options: "
                            "shuffle, shuffle=0, int32)", (int)l, p);
    }
    *out = tp_df_tensorpack_lmdb(path, shuffle, &o);
    return *out ? TP_OK : TP_ERR_INVALID;
}

/* ---- the writer ------------------------------------------------------------------ */

tp_status_t tp_tpk_lmdb_save(tp_dataflow_t *df, const char *path, tp_tpk_format_t fmt,
                             int64_t count, int64_t *written) {
    if (written)
        *written = 0;
    if (fmt != TP_TPK_PICKLE && fmt != TP_TPK_MSGPACK)
        return tp_error(TP_ERR_INVALID, "tensorpack-lmdb: write pickle or msgpack, not %s",
                        tp_tpk_format_name(fmt));
    struct stat st;
    int isdir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    char data[4200];
    snprintf(data, sizeof data, "%s%s", path, isdir ? "/data.mdb" : "");
    if (stat(data, &st) == 0)
        return tp_error(TP_ERR_INVALID, "tensorpack-lmdb %s exists (LMDBSerializer.save "
                        "refuses too)", data);
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_dbi dbi;
    int err = mdb_env_create(&env);
    if (!err)
        err = mdb_env_set_mapsize(env, (size_t)64 << 30);
    if (!err)
        err = mdb_env_open(env, path, MDB_NOSYNC | (isdir ? 0 : MDB_NOSUBDIR), 0644);
    if (!err)
        err = mdb_txn_begin(env, NULL, 0, &txn);
    if (!err)
        err = mdb_dbi_open(txn, NULL, 0, &dbi);
    tp_status_t rc = err ? s_mdb(err, path, "create") : TP_OK;
    int64_t n = 0;
    while (rc == TP_OK && (count < 0 || n < count)) {
        tp_datapoint_t *dp = NULL;
        rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE) {
            rc = TP_OK;
            if (count < 0)
                break;
            continue;  /* a given count runs on into the next pass */
        }
        if (rc != TP_OK)
            break;
        void *val = NULL;
        size_t vlen = 0;
        rc = tp_tpk_encode(dp, fmt, &val, &vlen);
        tp_datapoint_destroy(&dp);
        if (rc != TP_OK)
            break;
        char key[32];
        snprintf(key, sizeof key, "%08" PRId64, n);
        MDB_val k = {strlen(key), key}, v = {vlen, val};
        err = mdb_put(txn, dbi, &k, &v, 0);
        free(val);
        if (err) {
            rc = s_mdb(err, path, "put");
            break;
        }
        n++;
        if (n % 5000 == 0) {  /* LMDBSerializer's write_frequency */
            if ((err = mdb_txn_commit(txn)) || (err = mdb_txn_begin(env, NULL, 0, &txn))) {
                txn = NULL;
                rc = s_mdb(err, path, "commit");
            }
        }
    }
    if (rc == TP_OK) {
        char **keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
        char *kb = malloc((size_t)(n ? n : 1) * 24);
        if (!keys || !kb) {
            rc = tp_error(TP_ERR_NOMEM, "tensorpack-lmdb: keys");
        } else {
            for (int64_t i = 0; i < n; i++) {
                keys[i] = kb + i * 24;
                snprintf(keys[i], 24, "%08" PRId64, i);
            }
            void *val = NULL;
            size_t vlen = 0;
            rc = df_tpk_encode_keys(fmt, (const char *const *)keys, n, &val, &vlen);
            if (rc == TP_OK) {
                MDB_val k = {strlen(KEYS_KEY), KEYS_KEY}, v = {vlen, val};
                if ((err = mdb_put(txn, dbi, &k, &v, 0)))
                    rc = s_mdb(err, path, "put __keys__");
                free(val);
            }
        }
        free(keys);
        free(kb);
    }
    if (txn) {
        if (rc == TP_OK) {
            if ((err = mdb_txn_commit(txn)))
                rc = s_mdb(err, path, "commit");
        } else {
            mdb_txn_abort(txn);
        }
    }
    if (env) {
        if (rc == TP_OK && (err = mdb_env_sync(env, 1)))
            rc = s_mdb(err, path, "sync");
        mdb_env_close(env);
    }
    if (!isdir) {  /* LMDB's lock file beside a file-form database */
        char lock[4200];
        snprintf(lock, sizeof lock, "%s-lock", path);
        unlink(lock);
    }
    if (written)
        *written = n;
    return rc;
}
