/* towerpack tests: a tp-train killed with SIGKILL in the middle of a run
 * leaves an event file whose complete records all read (at most one
 * partial record at its end), and the file grew while the run was alive
 * (flushed every few seconds, not only at exit). The checker itself is
 * checked too: a truncated tail passes only with --partial-tail-ok, a
 * flipped byte in a complete record never. Own executable: it forks and
 * execs tp-train. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include "tfevents_testutil.h"

/* The path of the one event file in dir ("" if none yet). */
static void s_find(const char *dir, char *path, size_t size) {
    path[0] = '\0';
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            snprintf(path, size, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
}

static long s_size(const char *path) {
    struct stat st;
    return path[0] && stat(path, &st) == 0 ? (long)st.st_size : -1;
}

Test(proc_tfevents, sigkill_mid_run_leaves_whole_records, .timeout = 240) {
    char why[256];
    const char *py = te_python(why, sizeof why);
    if (!py)
        cr_skip_test("cannot read event files here: %s", why);
    char dir[] = "/tmp/tp-tfkill-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp",
                    "--epochs", "1000", "--steps-per-epoch", "50", "--threads", "1",
                    "--towers", "1", "--stats", "off",
                    "--test-spec", "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1",
                    "--logdir", logdir, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    pu_spawn_opts_t o = {.out = "/dev/null", .env = env};
    pid_t pid = pu_spawn(argv, &o);
    cr_assert_gt(pid, 0);
    /* The file appears at the start (file_version, hparams); it must then
     * grow while the run is alive: the per-step learning rate flushed
     * every 2 s, and epoch ends. Kill it after it grew twice. */
    char path[512] = "";
    long first = -1, grown = 0, last = -1;
    for (int i = 0; i < 1200 && grown < 2; i++) {
        if (!path[0])
            s_find(logdir, path, sizeof path);
        long sz = s_size(path);
        if (first < 0 && sz > 0)
            first = last = sz;
        else if (sz > last) {
            grown++;
            last = sz;
        }
        if (pu_gone(pid))
            break;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "tp-train ended before it was killed (status %d)", status);
    cr_assert(path[0], "no event file in %s", logdir);
    cr_assert_eq(grown, 2, "the event file did not grow while tp-train ran "
                 "(%ld bytes at the start, %ld at the end)", first, last);

    char out[8192];
    int rc = te_check(py, logdir, "--partial-tail-ok --hparams", out, sizeof out);
    if (rc == 77)
        cr_skip_test("%s", out);
    cr_assert_eq(rc, 0, "check_tfevents.py after SIGKILL:\n%s", out);

    /* The checker tells a partial tail from a corrupt record. */
    char copy[256], cmd[1024];
    snprintf(copy, sizeof copy, "%s/copy", dir);
    cr_assert_eq(mkdir(copy, 0755), 0);
    snprintf(cmd, sizeof cmd, "head -c %ld %s > %s/events.out.tfevents.0.copy",
             s_size(path) - 5, path, copy);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(te_check(py, copy, "--partial-tail-ok", out, sizeof out), 0, "%s", out);
    cr_assert_eq(te_check(py, copy, "", out, sizeof out), 1, "%s", out);
    /* one byte of the second record's data (after the first record),
     * inverted: writing a fixed value changed nothing when the byte
     * already had it (the record's wall time: 1 run in 256 passed) */
    snprintf(cmd, sizeof cmd, "%s/events.out.tfevents.0.copy", copy);
    FILE *f = fopen(cmd, "r+b");
    cr_assert_not_null(f, "%s", cmd);
    cr_assert_eq(fseek(f, 40 + 12 + 3, SEEK_SET), 0);
    int byte = fgetc(f);
    cr_assert_neq(byte, EOF);
    cr_assert_eq(fseek(f, 40 + 12 + 3, SEEK_SET), 0);
    cr_assert_neq(fputc(~byte & 0xff, f), EOF);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(te_check(py, copy, "--partial-tail-ok", out, sizeof out), 1,
                 "a corrupt complete record passed: %s", out);
    cr_assert(strstr(out, "CRC"), "%s", out);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- image summaries: SampleGrid through the TFEventWriter ---------------- */

#include <towerpack/towerpack.h>

/* A generator in miniature: z [N, 8] -> fc 36 -> [N, 1, 6, 6] -> sigmoid,
 * trained by mean squared error towards a fixed picture. */
static const tp_input_desc_t s_gen_inputs[] = {
    {"z", TP_FLOAT32, 2, {-1, 8}},
    {"target", TP_FLOAT32, 4, {-1, 1, 6, 6}},
};

static tp_status_t s_gen_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    int64_t shape[4] = {-1, 1, 6, 6};
    tp_node_t *g = tp_sigmoid(t, "gen", tp_reshape(t, "img", tp_fc(t, "fc", in[0], 36, 1),
                                                   4, shape));
    tp_tower_add_output(t, "gen", g);
    tp_node_t *cost = tp_mse(t, "cost", g, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_gen_opt(void *user) {
    (void)user;
    return tp_optimizer_adam(1e-2, 0.9, 0.999, 1e-8);
}

static tp_dataflow_t *s_gen_data(void) {
    tp_datapoint_t *dps[64];
    tp_rng_t rng;
    tp_rng_init(&rng, 7, 0);
    for (int i = 0; i < 64; i++) {
        tp_tensor_t z, y;
        int64_t zs[1] = {8}, ys[3] = {1, 6, 6};
        cr_assert_eq(tp_tensor_init(&z, TP_FLOAT32, 1, zs), TP_OK);
        cr_assert_eq(tp_tensor_init(&y, TP_FLOAT32, 3, ys), TP_OK);
        for (int k = 0; k < 8; k++)
            ((float *)z.data)[k] = (float)tp_rng_normal(&rng);
        for (int k = 0; k < 36; k++)  /* a diagonal stripe */
            ((float *)y.data)[k] = (k / 6 == k % 6) ? 1.f : 0.f;
        dps[i] = tp_datapoint_new(0);
        tp_datapoint_append(dps[i], &z);
        tp_datapoint_append(dps[i], &y);
    }
    return tp_df_batch(tp_df_from_list(dps, 64, 1), 16, 0);
}

/* Must hold: a SampleGrid's image reaches TensorBoard's event file (the
 * TFEventWriter runs on the callback actor: the image crosses it) once an
 * epoch, PNG that PIL decodes to the grid's size, with the very pixels of
 * LOGDIR/samples-EPOCH.png; the grid is 4 x 4 tiles of 6 x 6 with 2 px
 * between them. */
Test(proc_tfevents, sample_grids_reach_the_event_file_and_the_logdir, .timeout = 240) {
    char why[256];
    const char *py = te_python(why, sizeof why);
    if (!py)
        cr_skip_test("cannot read event files here: %s", why);
    char dir[] = "/tmp/tp-tfimg-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    tp_model_desc_t model = {s_gen_inputs, 2, s_gen_tower, s_gen_opt, NULL};
    /* the fixed noise: 16 rows */
    tp_tensor_t z;
    int64_t zs[2] = {16, 8};
    cr_assert_eq(tp_tensor_init(&z, TP_FLOAT32, 2, zs), TP_OK);
    tp_rng_t rng;
    tp_rng_init(&rng, 99, 0);
    for (int k = 0; k < 16 * 8; k++)
        ((float *)z.data)[k] = (float)tp_rng_normal(&rng);
    const char *names[] = {"z"};
    tp_sample_grid_opts_t go;
    tp_sample_grid_opts_init(&go);
    go.output = "gen";
    go.input_names = names;
    go.inputs = &z;
    go.ninputs = 1;
    tp_callback_t *cbs[] = {tp_cb_sample_grid(&go)};
    cr_assert_not_null(cbs[0], "%s", tp_last_error());
    tp_tensor_fini(&z);  /* copied */
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = s_gen_data();
    cfg.batch = 16;
    cfg.towers = 1;
    cfg.infer_batch = 16;
    cfg.max_epoch = 3;
    cfg.steps_per_epoch = 4;
    cfg.callbacks = cbs;
    cfg.ncallbacks = 1;
    cfg.logdir = logdir;
    cfg.logdir_action = TP_LOGDIR_DELETE;
    cr_assert_eq(tp_launch_train_with_config(&cfg, NULL), TP_OK, "%s", tp_last_error());
    char png[256];
    for (int e = 1; e <= 3; e++) {
        snprintf(png, sizeof png, "%s/samples-%d.png", logdir, e);
        tp_tensor_t img;
        cr_assert_eq(tp_image_read(png, NULL, &img), TP_OK, "%s: %s", png, tp_last_error());
        cr_assert_eq(img.shape[0], 34, "%s: height %lld", png, (long long)img.shape[0]);
        cr_assert_eq(img.shape[1], 34, "%s: width %lld", png, (long long)img.shape[1]);
        tp_tensor_fini(&img);
    }
    char out[8192];
    int rc = te_check(py, logdir, "--images=gen:3:samples", out, sizeof out);
    cr_assert_eq(rc, 0, "check_tfevents:\n%s", out);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
