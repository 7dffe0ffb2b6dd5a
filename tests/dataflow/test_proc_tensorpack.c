/* towerpack tests: tensorpack's formats against Python itself
 * (tensorpack_peer.py writes and reads them the way tensorpack's code does:
 * pickle.dumps(dp, protocol=-1), msgpack with msgpack_numpy, zmq_ops'
 * dump_arrays, send_dataflow_zmq's PUSH socket, LMDBSerializer.save,
 * RemoteDataZMQ's pickle.loads). Skipped when python3 lacks numpy,
 * msgpack, msgpack_numpy, zmq or lmdb. */
#include <criterion/criterion.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/image.h>
#include "proc_testutil.h"
#include "dataflow/tpk_testutil.h"
#include "dir_testutil.h"

static char s_dir[64];
static const char *s_py;

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-tpk");
    char why[300];
    s_py = tpk_python(why, sizeof why);
    if (!s_py)
        cr_skip_test("%s", why);
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

static void s_free(void *data, void *hint) {
    (void)hint;
    free(data);
}

static pid_t s_peer(const char *a1, const char *a2, const char *a3, const char *a4,
                    const char *a5) {
    char *argv[] = {"/usr/bin/env", (char *)s_py, TPK_PEER, (char *)a1, (char *)a2,
                    (char *)a3, (char *)a4, (char *)a5, NULL};
    pu_spawn_opts_t o = {.keep_stderr = 1};
    pid_t pid = pu_spawn(argv, &o);
    cr_assert_gt(pid, 0);
    return pid;
}

static void s_peer_ok(pid_t pid, const char *what) {
    int st = pu_waitpid(pid, 60000);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "python %s: status %d",
              what, st);
}

/* Python's messages, read from files, against its own description. */
static void s_files(const char *fmt) {
    char d[128], args[300];
    snprintf(d, sizeof d, "%s/%s", s_dir, fmt);
    mkdir(d, 0700);
    snprintf(args, sizeof args, "dump %s %s", fmt, d);
    cr_assert_eq(tpk_run(s_py, args), 0, "python dump %s", fmt);
    for (int k = 0; k < 3; k++) {
        char p[200];
        size_t n, tn;
        snprintf(p, sizeof p, "%s/msg_%d.bin", d, k);
        void *msg = tpk_read(p, &n);
        snprintf(p, sizeof p, "%s/truth_%d.txt", d, k);
        char *truth = tpk_read(p, &tn);
        truth = realloc(truth, tn + 1);
        truth[tn] = '\0';
        const char *want = !strncmp(fmt, "pickle", 6) ? "pickle" : fmt;
        cr_assert_str_eq(tp_tpk_format_name(tp_tpk_sniff(msg, n)), want);
        tp_datapoint_t *dp = NULL;
        /* the message is kept as the arrays' memory where it can be */
        cr_assert_eq(tp_tpk_decode(msg, n, NULL, s_free, NULL, &dp), TP_OK,
                     "%s message %d: %s", fmt, k, tp_last_error());
        tpk_expect(dp, truth);
        tp_datapoint_destroy(&dp);
        free(truth);
    }
}

Test(tpk_python, pickle_highest_protocol_arrives_identical, .init = s_setup, .fini = s_teardown) {
    s_files("pickle");
}
Test(tpk_python, pickle_protocols_2_and_4_arrive_identical, .init = s_setup, .fini = s_teardown) {
    s_files("pickle2");
    s_files("pickle4");
}
/* numpy 2.x names its reconstructors numpy._core.*: the same arrays */
Test(tpk_python, numpy2_pickles_arrive_identical, .init = s_setup, .fini = s_teardown) {
    s_files("pickle-np2");
    s_files("pickle2-np2");
}
Test(tpk_python, msgpack_numpy_arrives_identical, .init = s_setup, .fini = s_teardown) {
    s_files("msgpack");
}
Test(tpk_python, zmq_ops_arrives_identical, .init = s_setup, .fini = s_teardown) {
    s_files("zmq_ops");
}

/* send_dataflow_zmq in Python -> the remote: source here. */
static void s_over_zmq(const char *fmt) {
    char d[128], args[300], ep[160];
    snprintf(d, sizeof d, "%s/%s", s_dir, fmt);
    mkdir(d, 0700);
    snprintf(args, sizeof args, "dump %s %s", fmt, d);
    cr_assert_eq(tpk_run(s_py, args), 0);
    snprintf(ep, sizeof ep, "ipc://%s/%s.sock", s_dir, fmt);
    char spec[200];
    snprintf(spec, sizeof spec, "remote:%s", ep);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    pid_t py = s_peer("send", fmt, ep, "3", NULL);
    for (int k = 0; k < 3; k++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        char p[200];
        size_t tn;
        snprintf(p, sizeof p, "%s/truth_%d.txt", d, k);
        char *truth = tpk_read(p, &tn);
        truth = realloc(truth, tn + 1);
        truth[tn] = '\0';
        tpk_expect(dp, truth);
        free(truth);
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_df_remote_malformed(df), 0);
    s_peer_ok(py, "send");
    tp_dataflow_destroy(&df);
}

Test(tpk_python, send_dataflow_zmq_pickle_to_remote, .init = s_setup, .fini = s_teardown) {
    s_over_zmq("pickle");
}
Test(tpk_python, send_dataflow_zmq_msgpack_to_remote, .init = s_setup, .fini = s_teardown) {
    s_over_zmq("msgpack");
}
Test(tpk_python, send_dataflow_zmq_zmq_ops_to_remote, .init = s_setup, .fini = s_teardown) {
    s_over_zmq("zmq_ops");
}

/* Python's own hostile pickles: refused by name, counted, and the receiver
 * goes on to the next good message. */
Test(tpk_python, hostile_pickles_refused_counted_receiver_goes_on, .init = s_setup,
     .fini = s_teardown) {
    char args[300];
    snprintf(args, sizeof args, "hostile %s", s_dir);
    cr_assert_eq(tpk_run(s_py, args), 0);
    static const struct { const char *file, *names; } cases[] = {
        {"os_system_py", "system' refused"}, {"os_system", "global 'os.system' refused"},
        {"eval_py", "global 'builtins.eval' refused"}, {"eval_p2", "eval' refused"},
        {"unknown_opcode", "opcode 0xff"}, {"truncated", "truncated"},
        {"huge_length", "a length of 4611686018427387904"},
        {"deep_lists", "nested deeper than 32"}, {"fortran", "Fortran-order"},
        {"object_array", "object array"},
    };
    size_t nc = sizeof cases / sizeof *cases;
    void *msgs[16];
    size_t lens[16];
    for (size_t i = 0; i < nc; i++) {
        char p[200];
        snprintf(p, sizeof p, "%s/%s.bin", s_dir, cases[i].file);
        msgs[i] = tpk_read(p, &lens[i]);
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_tpk_decode(msgs[i], lens[i], NULL, NULL, NULL, &dp), TP_ERR_PROTOCOL,
                     "%s accepted", cases[i].file);
        cr_assert(strstr(tp_last_error(), cases[i].names), "%s: '%s' does not say '%s'",
                  cases[i].file, tp_last_error(), cases[i].names);
    }
    /* over the wire, between good datapoints */
    char ep[160];
    snprintf(ep, sizeof ep, "ipc://%s/h.sock", s_dir);
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    o.timeout_s = 20;
    tp_dataflow_t *df = tp_df_remote(ep, &o);
    cr_assert(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
    void *ctx = zmq_ctx_new();
    void *push = zmq_socket(ctx, ZMQ_PUSH);
    cr_assert_eq(zmq_connect(push, ep), 0);
    for (size_t i = 0; i < nc; i++)
        cr_assert_eq(zmq_send(push, msgs[i], lens[i], 0), (int)lens[i]);
    char d[128];
    snprintf(d, sizeof d, "%s/good", s_dir);
    mkdir(d, 0700);
    snprintf(args, sizeof args, "dump pickle %s", d);
    cr_assert_eq(tpk_run(s_py, args), 0);
    char p[200];
    size_t gn;
    snprintf(p, sizeof p, "%s/msg_0.bin", d);
    void *good = tpk_read(p, &gn);
    cr_assert_eq(zmq_send(push, good, gn, 0), (int)gn);
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_datapoint_size(dp), 15);
    cr_assert_eq(tp_df_remote_malformed(df), nc);
    tp_datapoint_destroy(&dp);
    free(good);
    for (size_t i = 0; i < nc; i++)
        free(msgs[i]);
    zmq_close(push);
    zmq_ctx_term(ctx);
    tp_dataflow_destroy(&df);
}

/* LMDBSerializer.save in Python -> tensorpack-lmdb: here, in order and
 * shuffled, file and directory form, pickle and msgpack. */
static void s_lmdb(const char *fmt, int dir) {
    char path[160], args[400];
    snprintf(path, sizeof path, "%s/%s%s.lmdb", s_dir, fmt, dir ? "_dir" : "");
    snprintf(args, sizeof args, "lmdb %s %s 25%s", fmt, path, dir ? " dir" : "");
    cr_assert_eq(tpk_run(s_py, args), 0, "python lmdb");
    char tpath[200];
    snprintf(tpath, sizeof tpath, "%s.truth", path);
    size_t tn;
    char *truth = tpk_read(tpath, &tn);
    truth = realloc(truth, tn + 1);
    truth[tn] = '\0';
    /* in order: every datapoint as written */
    char spec[300];
    snprintf(spec, sizeof spec, "tensorpack-lmdb:%s", path);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 25);
    const char *t = truth;
    const char *starts[25];
    for (int k = 0; k < 25; k++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        starts[k] = t;
        t = tpk_expect(dp, t);
        tp_datapoint_destroy(&dp);
    }
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    tp_dataflow_destroy(&df);
    /* shuffled: each exactly once a pass, in another order each pass; the
     * label component (2: [k, -3, 2^40]) says which it is */
    snprintf(spec, sizeof spec, "tensorpack-lmdb:%s,shuffle", path);
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 5, 0), TP_OK);
    int orders[2][25];
    for (int pass = 0; pass < 2; pass++) {
        int seen[25] = {0}, in_order = 1;
        for (int k = 0; k < 25; k++) {
            cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
            int64_t idx = ((int64_t *)tp_datapoint_cget(dp, 2)->data)[0];
            cr_assert(idx >= 0 && idx < 25 && !seen[idx]);
            seen[idx] = 1;
            in_order &= idx == k;
            orders[pass][k] = (int)idx;
            tpk_expect(dp, starts[idx]);
            tp_datapoint_destroy(&dp);
        }
        cr_assert(!in_order, "pass %d was not shuffled", pass);
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    }
    cr_assert(memcmp(orders[0], orders[1], sizeof orders[0]), "two passes, one order");
    tp_dataflow_destroy(&df);
    free(truth);
}

Test(tpk_python, lmdbserializer_file_pickle_in_order_and_shuffled, .init = s_setup,
     .fini = s_teardown) {
    s_lmdb("pickle", 0);
}
Test(tpk_python, lmdbserializer_dir_msgpack_in_order_and_shuffled, .init = s_setup,
     .fini = s_teardown) {
    s_lmdb("msgpack", 1);
}

/* The way back: tp-worker --format tensorpack(-msgpack) -> RemoteDataZMQ's
 * loads in Python; and the LMDB writer -> LMDBData + loads in Python. The
 * data: a tensorpack LMDB written by Python, so the truth is Python's. */
static void s_back(const char *format, const char *pyfmt) {
    char path[160], args[400], ep[160], out[200];
    snprintf(path, sizeof path, "%s/src.lmdb", s_dir);
    snprintf(args, sizeof args, "lmdb pickle %s 4", path);
    cr_assert_eq(tpk_run(s_py, args), 0);
    snprintf(ep, sizeof ep, "ipc://%s/back.sock", s_dir);
    snprintf(out, sizeof out, "%s/back.txt", s_dir);
    pid_t py = s_peer("pull", ep, "4", pyfmt, out);
    char spec[300];
    snprintf(spec, sizeof spec, "tensorpack-lmdb:%s", path);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", spec, "--connect", ep,
                     "--format", (char *)format, "--count", "4", NULL};
    pu_spawn_opts_t wo = {.out = "/dev/null"};
    pid_t w = pu_spawn(wargv, &wo);
    s_peer_ok(py, "pull");
    int st = pu_waitpid(w, 30000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-worker status %d", st);
    size_t n, tn;
    char *got = tpk_read(out, &n);
    char tpath[200];
    snprintf(tpath, sizeof tpath, "%s.truth", path);
    char *truth = tpk_read(tpath, &tn);
    cr_assert(n == tn && !memcmp(got, truth, n),
              "Python read back other than was written:\n%.600s\n---\n%.600s", got, truth);
    free(got);
    free(truth);
}

Test(tpk_python, tp_worker_format_tensorpack_read_by_pickle_loads, .init = s_setup,
     .fini = s_teardown) {
    s_back("tensorpack", "pickle");
}
Test(tpk_python, tp_worker_format_tensorpack_msgpack_read_by_msgpack, .init = s_setup,
     .fini = s_teardown) {
    s_back("tensorpack-msgpack", "msgpack");
}

Test(tpk_python, lmdb_writer_read_by_python_lmdbdata, .init = s_setup, .fini = s_teardown) {
    char src[160], dst[160], args[400], out[200];
    snprintf(src, sizeof src, "%s/src.lmdb", s_dir);
    snprintf(args, sizeof args, "lmdb msgpack %s 7", src);
    cr_assert_eq(tpk_run(s_py, args), 0);
    const char *fmts[] = {"pickle", "msgpack"};
    for (int f = 0; f < 2; f++) {
        snprintf(dst, sizeof dst, "%s/out_%s.lmdb", s_dir, fmts[f]);
        tp_dataflow_t *df = tp_df_tensorpack_lmdb(src, 0, NULL);
        cr_assert(df, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
        int64_t written = 0;
        cr_assert_eq(tp_tpk_lmdb_save(df, dst, f ? TP_TPK_MSGPACK : TP_TPK_PICKLE, -1,
                                      &written), TP_OK, "%s", tp_last_error());
        cr_assert_eq(written, 7);
        tp_dataflow_destroy(&df);
        snprintf(out, sizeof out, "%s/read_%s.txt", s_dir, fmts[f]);
        snprintf(args, sizeof args, "readlmdb %s %s", dst, out);
        cr_assert_eq(tpk_run(s_py, args), 0, "python could not read %s", dst);
        size_t n, tn;
        char *got = tpk_read(out, &n);
        char tpath[200];
        snprintf(tpath, sizeof tpath, "%s.truth", src);
        char *truth = tpk_read(tpath, &tn);
        cr_assert(n == tn && !memcmp(got, truth, n), "%s: Python read other than written",
                  fmts[f]);
        free(got);
        free(truth);
    }
}

/* tp-train --remote fed by a Python send_dataflow_zmq of BatchData:
 * pickled [uint8 (64,28,28), int64 (64,)] batches; the int64 labels reach
 * the model as int32. */
Test(tpk_python, tp_train_remote_from_python_batches, .init = s_setup, .fini = s_teardown) {
    char logdir[160], ep[160], bind[170];
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(ep, sizeof ep, "ipc://%s/train.sock", s_dir);
    snprintf(bind, sizeof bind, "@%s", ep);
    pid_t py = s_peer("batches", "pickle", ep, "6", "64");
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                    "--steps-per-epoch", "6", "--batch", "64", "--remote", bind,
                    "--threads", "1", "--towers", "1", "--test-spec",
                    "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1",
                    "--logdir", logdir, "--no-tensorboard", NULL};
    char log[200];
    snprintf(log, sizeof log, "%s/train.out", s_dir);
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    pu_spawn_opts_t o = {.out = log, .env = env};
    pid_t tr = pu_spawn(argv, &o);
    int st = pu_waitpid(tr, 120000);
    s_peer_ok(py, "batches");
    size_t n;
    char *text = tpk_read(log, &n);
    text = realloc(text, n + 1);
    text[n] = '\0';
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train status %d:\n%s", st, text);
    cr_assert(strstr(text, "receiving tensorpack's pickle messages"), "%s", text);
    free(text);
}

/* tp-train --data / --test-data on LMDBSerializer files: [uint8 (28,28),
 * Python int label] datapoints; the labels (int64) reach the model as int32. */
Test(tpk_python, tp_train_data_tensorpack_lmdb, .init = s_setup, .fini = s_teardown) {
    char train[160], test[160], args[400], logdir[160], dspec[200], tspec[200];
    snprintf(train, sizeof train, "%s/train.lmdb", s_dir);
    snprintf(test, sizeof test, "%s/test.lmdb", s_dir);
    snprintf(args, sizeof args, "imagelmdb pickle %s 256", train);
    cr_assert_eq(tpk_run(s_py, args), 0);
    snprintf(args, sizeof args, "imagelmdb msgpack %s 100", test);
    cr_assert_eq(tpk_run(s_py, args), 0);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(dspec, sizeof dspec, "tensorpack-lmdb:%s,shuffle", train);
    snprintf(tspec, sizeof tspec, "tensorpack-lmdb:%s", test);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                    "--batch", "64", "--data", dspec, "--test-data", tspec,
                    "--threads", "1", "--towers", "1", "--no-augment",
                    "--logdir", logdir, "--no-tensorboard", NULL};
    char log[200];
    snprintf(log, sizeof log, "%s/train.out", s_dir);
    pu_spawn_opts_t o = {.out = log};
    pid_t tr = pu_spawn(argv, &o);
    int st = pu_waitpid(tr, 120000);
    size_t n;
    char *text = tpk_read(log, &n);
    text = realloc(text, n + 1);
    text[n] = '\0';
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train status %d:\n%s", st, text);
    cr_assert(strstr(text, "test accuracy"), "%s", text);
    free(text);
}

/* ---- JPEG bytes in tensorpack's LMDB, decoded in forked workers ----------------- */

/* tensorpack's "Efficient DataFlow" recipe for ImageNet: LMDBSerializer.save
 * of [jpeg, label] with the jpeg an np.uint8 array of the file's bytes (or
 * the bytes themselves). `tensorpack-lmdb:PATH | decode mode=rgb` run in 2
 * forked workers yields, for every record, the pixels of decoding the
 * file itself, and its label. */
static void s_jpeg_lmdb(const char *fmt, const char *kind) {
    char d[160], path[200], args[500];
    snprintf(d, sizeof d, "%s/jpg-%s-%s", s_dir, fmt, kind);
    cr_assert_eq(mkdir(d, 0700), 0);
    enum { N = 6 };
    for (int k = 0; k < N; k++) {
        int64_t shape[3] = {20 + k, 24, 3};
        tp_tensor_t t;
        cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 3, shape), TP_OK);
        uint8_t *p = t.data;
        for (size_t i = 0; i < t.nbytes; i++)
            p[i] = (uint8_t)((i * 7 + k * 31 + (i / 72) * 5) & 255);
        void *jpg;
        size_t n;
        cr_assert_eq(tp_image_encode_jpeg(&t, 90, &jpg, &n), TP_OK);
        snprintf(path, sizeof path, "%s/%d.jpg", d, k);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(jpg, 1, n, f), n);
        fclose(f);
        free(jpg);
        tp_tensor_fini(&t);
    }
    snprintf(path, sizeof path, "%s.lmdb", d);
    snprintf(args, sizeof args, "jpeglmdb %s %s %s %s", fmt, path, d, kind);
    cr_assert_eq(tpk_run(s_py, args), 0, "python %s", args);
    char spec[300];
    snprintf(spec, sizeof spec, "tensorpack-lmdb:%s | decode mode=rgb", path);
    tp_dataflow_t *inner = NULL;
    cr_assert_eq(tp_spec_parse(spec, &inner), TP_OK, "%s", tp_last_error());
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.allow_threads = 1;  /* Criterion's own thread */
    tp_dataflow_t *df = tp_df_multiprocess(inner, 2, &o);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 5, 0), TP_OK, "%s", tp_last_error());
    int seen[N] = {0}, nseen = 0;
    tp_image_opts_t io;
    tp_image_opts_init(&io);
    io.mode = TP_IMAGE_RGB;
    for (int i = 0; i < 400 && nseen < N; i++) {
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE)
            continue;
        cr_assert_eq(rc, TP_OK, "%s %s: %s", fmt, kind, tp_last_error());
        cr_assert_eq(tp_datapoint_size(dp), 2);
        const tp_tensor_t *img = tp_datapoint_cget(dp, 0), *lab = tp_datapoint_cget(dp, 1);
        cr_assert(lab->ndim == 0 && (lab->dtype == TP_INT64 || lab->dtype == TP_INT32),
                  "label dtype %d ndim %d", (int)lab->dtype, lab->ndim);
        int64_t k = lab->dtype == TP_INT64 ? *(const int64_t *)lab->data
                                           : *(const int32_t *)lab->data;
        cr_assert(k >= 0 && k < N, "label %lld", (long long)k);
        snprintf(path, sizeof path, "%s/%lld.jpg", d, (long long)k);
        tp_tensor_t want;
        cr_assert_eq(tp_image_read(path, &io, &want), TP_OK, "%s", tp_last_error());
        cr_assert(tp_tensor_equal(img, &want), "%s %s: record %lld decoded in a worker "
                  "differs from decoding %s", fmt, kind, (long long)k, path);
        tp_tensor_fini(&want);
        nseen += !seen[k];
        seen[k] = 1;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(nseen, N, "%s %s: %d of %d records seen", fmt, kind, nseen, N);
    tp_dataflow_destroy(&df);
}

Test(tpk_python, jpeg_bytes_in_tensorpack_lmdb_decoded_in_workers, .init = s_setup,
     .fini = s_teardown) {
    s_jpeg_lmdb("pickle", "array");
    s_jpeg_lmdb("msgpack", "array");
    s_jpeg_lmdb("pickle", "bytes");
    s_jpeg_lmdb("msgpack", "bytes");
}
