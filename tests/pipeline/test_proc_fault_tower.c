/* towerpack fault injection: a tower op that fails in the middle of
 * training. The planted fault is corrupt data, the way it happens to users:
 * one datapoint deep in the stream carries a label outside the model's
 * classes, so the loss op of whichever tower gets it refuses its batch.
 * Must hold, with one tower (on the trainer's thread) and with two (tower
 * actors, StagingInput), the data read by forked workers:
 *  - the run ends with an error within 1 s of the last good step;
 *  - the error names the tower, the op and the step;
 *  - no worker process is left behind;
 *  - the checkpoint of the last finished epoch is intact and loads.
 * Own executable: the dataflow forks workers. */
#include <dirent.h>
#include <sys/wait.h>
#include "actor_testutil.h"
#include "fault_util.h"
#include "proc_testutil.h"

#define BAD_LABEL 77

/* `n` Fashion-MNIST-shaped datapoints (image uint8 [28, 28], label int32),
 * label i % 10, except datapoint bad_at, whose label is BAD_LABEL. */
typedef struct {
    int64_t n, bad_at, i;
} s_corrupt_t;

static tp_status_t corrupt_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    (void)rng, (void)seed, (void)stream;
    ((s_corrupt_t *)impl)->i = 0;
    return TP_OK;
}

static tp_status_t corrupt_begin(void *impl) {
    ((s_corrupt_t *)impl)->i = 0;
    return TP_OK;
}

static tp_status_t corrupt_next(void *impl, tp_datapoint_t **out) {
    s_corrupt_t *c = impl;
    if (c->i >= c->n)
        return TP_DONE;
    int64_t img[] = {28, 28};
    tp_datapoint_t *dp = tp_datapoint_new(2);
    if (!dp)
        return TP_ERR_NOMEM;
    tp_tensor_init(tp_datapoint_get(dp, 0), TP_UINT8, 2, img);
    memset(tp_datapoint_get(dp, 0)->data, (int)(c->i % 251), 28 * 28);
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 1)->data =
        c->i == c->bad_at ? BAD_LABEL : (int32_t)(c->i % 10);
    c->i++;
    *out = dp;
    return TP_OK;
}

static int64_t corrupt_size(void *impl) { return ((s_corrupt_t *)impl)->n; }

static const tp_dataflow_ops_t s_corrupt_ops = {
    .name = "corrupt-labels", .reset_state = corrupt_reset, .begin = corrupt_begin,
    .next = corrupt_next, .size = corrupt_size, .destroy = free,
};

/* The time of the last step that ended well (trigger_step). */
typedef struct {
    double last_step_s;
    int64_t last_global_step;
} s_clock_t;

static tp_status_t clock_trigger_step(void *impl, tp_trainer_t *tr) {
    s_clock_t *c = impl;
    c->last_step_s = tp_now_s();
    c->last_global_step = tp_trainer_global_step(tr);
    return TP_OK;
}

static const tp_callback_ops_t s_clock_ops = {
    .name = "LastStepClock", .trigger_step = clock_trigger_step,
};

/* How many processes in the system have `pid` as their parent. */
static int s_children_of(pid_t pid) {
    int kids[64];
    return fu_children((int)pid, kids, 64);
}

/* Train the zoo's mlp on the corrupt stream: up to 3 epochs of 6 steps of
 * batch 4 per tower, the data read by a forked worker (one, so that the
 * order is the stream's). The bad datapoint is the second of the last
 * tower's batch at step 2 of epoch 2, so epoch 1 ends with a checkpoint. */
static void s_tower_fault(int towers) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-fault-tower-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));

    const int batch = 4, steps = 6;
    s_corrupt_t *c = calloc(1, sizeof *c);
    c->n = 1000;
    c->bad_at = steps * towers * batch + 2 * towers * batch + (towers - 1) * batch + 1;
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.allow_threads = 1;  /* Criterion's own thread */
    tp_dataflow_t *df = tp_df_batch(
        tp_df_multiprocess(tp_dataflow_new(&s_corrupt_ops, c), 1, &o), batch, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    pu_assert_fork_safe("tower_fault");

    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    tp_model_desc_t desc = {inputs, 2, tp_zoo_find("mlp")->build, fu_opt, NULL};
    s_clock_t *clk = calloc(1, sizeof *clk);
    tp_callback_t *cbs[1] = {tp_callback_new(&s_clock_ops, clk, 0)};
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = df;
    cfg.batch = batch;
    cfg.towers = towers;
    cfg.threads = 1;
    cfg.max_epoch = 3;
    cfg.steps_per_epoch = steps;
    cfg.logdir = dir;
    cfg.default_callbacks = 0;
    cfg.stats = "off";
    cfg.callbacks = cbs;
    cfg.ncallbacks = 1;
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    double ended = tp_now_s();
    const char *err = tp_last_error();

    cr_assert_lt(rc, 0, "training went through a corrupt datapoint");
    cr_assert_eq(clk->last_global_step, steps + 2, "the last good step: global "
                 "step %lld", (long long)clk->last_global_step);
    cr_assert_lt(ended - clk->last_step_s, 1.0,
                 "%.3f s from the last good step to the error",
                 ended - clk->last_step_s);
    /* what: the op and its message; where: the tower and the step */
    cr_assert(strstr(err, "forward of 'cost'"), "names the op: %s", err);
    cr_assert(strstr(err, "label 77"), "says what was wrong: %s", err);
    char tower[24];
    snprintf(tower, sizeof tower, "tower%d", towers - 1);
    cr_assert(strstr(err, tower), "names the tower (%s): %s", tower, err);
    cr_assert(strstr(err, "step 2 of epoch 2"), "names the step: %s", err);

    /* no orphans: the workers were stopped and reaped */
    cr_assert_eq(s_children_of(getpid()), 0, "worker processes left behind");
    cr_assert_eq(waitpid(-1, NULL, WNOHANG), -1, "a child left to reap");

    /* no lost checkpoint: epoch 1's is the latest and loads */
    char ckpt[4096];
    cr_assert_eq(tp_checkpoint_find_latest(dir, ckpt, sizeof ckpt), TP_OK,
                 "%s", tp_last_error());
    int64_t gs = -1;
    cr_assert_eq(fu_load("mlp", ckpt, &gs), TP_OK, "%s: %s", ckpt, tp_last_error());
    cr_assert_eq(gs, steps, "%s holds global step %lld", ckpt, (long long)gs);
    free(clk);
    fu_rmrf(dir);
}

TestSuite(fault_tower, .timeout = 60);

Test(fault_tower, failing_op_one_tower) { s_tower_fault(1); }

Test(fault_tower, failing_op_two_towers) { s_tower_fault(2); }
