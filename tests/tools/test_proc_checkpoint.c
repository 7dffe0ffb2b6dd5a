/* towerpack tests: damaged checkpoints as the tools meet them (issue 48).
 * A short tp-train run writes two checkpoints; then bit flips in tensor
 * data and a NaN bias are refused by tp-predict and tp-export naming the
 * file and the tensor, `tp-train --resume` falls back to the newest
 * checkpoint that verifies and says so (and refuses when none does), a FIFO
 * named like a checkpoint is refused or skipped without hanging, and the
 * files read the same in Python (xxhash's sums, a numpy reader, safetensors
 * where installed). Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ckpt_testutil.h"
#include "proc_testutil.h"
#include <towerpack/towerpack.h>
#include "dir_testutil.h"

#define TEST_SPEC "fashion-mnist:test,shuffle=0 | batch 100 | fixed-size 2"
#define CHECK TP_SOURCE_DIR "/tests/tools/checkpoint_check.py"

static char s_dir[64], s_logdir[128];
static char s_out[1 << 18];

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-ckpt-cli");
    snprintf(s_logdir, sizeof s_logdir, "%s/run", s_dir);
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

static const char *s_at(const char *name) {
    static char p[4][192];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", s_logdir, name);
    return p[k];
}

/* bin/<tool> with argv (argv[0] ignored), output into s_out, at most
 * 60 s (a hang is a failure, not a stuck suite): the exit status, -1 when
 * killed. */
static int s_run(const char *tool, char *const *argv) {
    char path[256], log[160];
    snprintf(path, sizeof path, TP_BINARY_DIR "/bin/%s", tool);
    snprintf(log, sizeof log, "%s/out.txt", s_dir);
    unlink(log);
    char *full[64] = {path};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    pu_spawn_opts_t o = {.out = log, .env = env};
    pid_t pid = pu_spawn(full, &o);
    cr_assert(pid > 0);
    int st = pu_waitpid(pid, 60000);
    s_out[0] = '\0';
    FILE *f = fopen(log, "r");
    if (f) {
        size_t n = fread(s_out, 1, sizeof s_out - 1, f);
        s_out[n] = '\0';
        fclose(f);
    }
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* tp-train of the mlp, `epochs` epochs of 5 steps, in s_logdir. */
static int s_train(const char *epochs, int resume) {
    char *argv[] = {"tp-train", "--model", "mlp", "--epochs", (char *)epochs,
                    "--steps-per-epoch", "5", "--threads", "1", "--test-spec", TEST_SPEC,
                    "--logdir", s_logdir, resume ? "--resume" : NULL, NULL};
    return s_run("tp-train", argv);
}

static void s_flip(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)meta;
    size_t b, e;
    ckpt_span(root, (const char *)u, &b, &e);
    for (int i = 0; i < 20; i++)
        data[b + (size_t)(i * 7919) % (e - b)] ^= (unsigned char)(1u << (i % 8));
}

static void s_nan(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)meta, (void)u;
    size_t b, e;
    ckpt_span(root, "linear/b", &b, &e);
    float v = NAN;
    memcpy(data + b, &v, sizeof v);
}

Test(proc_checkpoint, damaged_weights_are_refused_by_tp_predict_and_tp_export,
     .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(s_train("2", 0), 0, "%s", s_out);
    /* 20 bit flips in one tensor, the sums left as written */
    ckpt_edit(s_at("model-10.safetensors"), s_at("flip.safetensors"), s_flip, "fc0/W", 0);
    char *pred[] = {"tp-predict", "--load", (char *)s_at("flip.safetensors"), "--spec",
                    TEST_SPEC, "--confusion", "none", NULL};
    cr_expect_eq(s_run("tp-predict", pred), 1, "%s", s_out);
    cr_expect(strstr(s_out, "flip.safetensors: tensor 'fc0/W' fails its checksum"), "%s",
              s_out);
    char onnx[160];
    snprintf(onnx, sizeof onnx, "%s/m.onnx", s_dir);
    char *exp[] = {"tp-export", "--load", (char *)s_at("flip.safetensors"), "--onnx", onnx,
                   NULL};
    cr_expect_eq(s_run("tp-export", exp), 1, "%s", s_out);
    cr_expect(strstr(s_out, "flip.safetensors: tensor 'fc0/W' fails its checksum"), "%s",
              s_out);
    cr_expect_neq(access(onnx, F_OK), 0, "an ONNX file from a damaged checkpoint");
    /* a NaN bias with sums that match: the value check refuses it */
    ckpt_edit(s_at("model-10.safetensors"), s_at("nan.safetensors"), s_nan, NULL, 1);
    pred[2] = (char *)s_at("nan.safetensors");
    cr_expect_eq(s_run("tp-predict", pred), 1, "%s", s_out);
    cr_expect(strstr(s_out, "nan.safetensors: tensor 'linear/b' holds NaN"), "%s", s_out);
    /* the intact one still predicts */
    pred[2] = (char *)s_at("model-10.safetensors");
    cr_expect_eq(s_run("tp-predict", pred), 0, "%s", s_out);
}

Test(proc_checkpoint, resume_falls_back_to_the_newest_checkpoint_that_verifies,
     .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(s_train("2", 0), 0, "%s", s_out);
    ckpt_edit(s_at("model-10.safetensors"), s_at("model-10.safetensors"), s_flip,
              "linear/W", 0);
    cr_assert_eq(s_train("3", 1), 0, "%s", s_out);
    cr_expect(strstr(s_out, "model-10.safetensors: tensor 'linear/W' fails its checksum"),
              "%s", s_out);
    cr_expect(strstr(s_out, "falling back to ") &&
              strstr(strstr(s_out, "falling back to "), "model-5.safetensors"), "%s", s_out);
    /* it went on from step 5: the damaged step 10 written anew, step 15 */
    tp_train_state_t st;
    cr_expect_eq(tp_checkpoint_verify(s_at("model-10.safetensors"), 5, &st), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(tp_checkpoint_verify(s_at("model-15.safetensors"), 5, &st), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(st.global_step, 15);
    /* none verifies: an error, never a silent start from scratch */
    static const char *all[] = {"model-5.safetensors", "model-10.safetensors",
                                "model-15.safetensors"};
    for (int i = 0; i < 3; i++)
        ckpt_edit(s_at(all[i]), s_at(all[i]), s_flip, "linear/b", 0);
    cr_expect_eq(s_train("4", 1), 1, "%s", s_out);
    cr_expect(strstr(s_out, "no checkpoint in") && strstr(s_out, "verifies"), "%s", s_out);
    cr_expect_neq(access(s_at("model-20.safetensors"), F_OK), 0);
}

static void s_set_meta(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)root, (void)data;
    const char *const *kv = u;
    json_object_set_new(meta, kv[0], json_string(kv[1]));
}

/* Metadata that disagrees with the schedule (global_step 3 at the end of
 * epoch 2 of 5 steps) is refused by name, and the resume falls back. */
Test(proc_checkpoint, resume_refuses_metadata_the_schedule_disagrees_with,
     .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(s_train("2", 0), 0, "%s", s_out);
    static const char *kv[2] = {"global_step", "3"};
    ckpt_edit(s_at("model-10.safetensors"), s_at("model-10.safetensors"), s_set_meta,
              (void *)kv, 0);
    cr_assert_eq(s_train("3", 1), 0, "%s", s_out);
    cr_expect(strstr(s_out, "model-10.safetensors: metadata 'global_step' 3 disagrees with "
                            "'epoch' 2 at 5 steps per epoch"), "%s", s_out);
    cr_expect(strstr(s_out, "falling back to ") &&
              strstr(strstr(s_out, "falling back to "), "model-5.safetensors"), "%s", s_out);
}

/* A FIFO named like a checkpoint: tp-predict refuses it at once; a resume
 * skips it. Each run is bounded: on a hang it is killed and fails. */
Test(proc_checkpoint, a_fifo_named_like_a_checkpoint_does_not_hang,
     .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(s_train("1", 0), 0, "%s", s_out);
    cr_assert_eq(mkfifo(s_at("model-99.safetensors"), 0600), 0);
    char *pred[] = {"tp-predict", "--load", (char *)s_at("model-99.safetensors"), "--spec",
                    TEST_SPEC, "--confusion", "none", NULL};
    cr_expect_eq(s_run("tp-predict", pred), 1, "%s", s_out);
    cr_expect(strstr(s_out, "model-99.safetensors: not a regular file (a FIFO)"), "%s", s_out);
    /* no index: the listing would pick step 99 */
    cr_assert_eq(unlink(s_at("checkpoint")), 0);
    pred[2] = s_logdir;
    cr_expect_eq(s_run("tp-predict", pred), 0, "%s", s_out);
    cr_expect(strstr(s_out, "model-5.safetensors"), "%s", s_out);
    cr_expect_eq(s_train("2", 1), 0, "%s", s_out);
    cr_expect(strstr(s_out, "model-99.safetensors is not a regular file"), "%s", s_out);
    cr_expect_eq(access(s_at("model-10.safetensors"), F_OK), 0, "%s", s_out);
}

Test(proc_checkpoint, python_reads_the_file_and_agrees_on_the_checksums,
     .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(s_train("2", 0), 0, "%s", s_out);
    PU_PYTHON_EXPECT(CHECK, s_logdir, "xxhash agrees on 26 tensors");
}
