/* towerpack tests: the base trainer loop, hook order, callbacks, monitors,
 * hyper-parameter setters, sidecars, a trainer that follows a loop run
 * elsewhere, and the log directory. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/logdir.h>
#include <towerpack/towerpack.h>
#include "pipeline/trainer_internal.h"  /* sidecars, tp_trainer_follow */

/* ---- a recording trainer and callback ------------------------------------ */

typedef struct {
    char log[16384];
    double lr;
    int fail_at_step;      /* global step (1-based) whose run_step fails, 0 never */
    int nan_at_step;
    int64_t steps;
    double step_lr[64];    /* [steps] the rate each step ran at (the first 64) */
} s_train_t;

static void s_log(s_train_t *t, const char *what) {
    size_t n = strlen(t->log);
    snprintf(t->log + n, sizeof t->log - n, "%s%s", n ? " " : "", what);
}

static tp_status_t s_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_train_t *t = impl;
    if (t->steps < 64)
        t->step_lr[t->steps] = t->lr;
    t->steps++;
    s_log(t, "step");
    if (t->fail_at_step && tp_trainer_global_step(tr) + 1 == t->fail_at_step)
        return tp_error(TP_ERR_IO, "injected step failure");
    double loss = 1.0 / (double)(tp_trainer_global_step(tr) + 1);
    if (t->nan_at_step && tp_trainer_global_step(tr) + 1 == t->nan_at_step)
        loss = NAN;
    tp_fetches_set(f, "loss", loss);
    tp_fetches_set(f, "unasked", 5.0);
    return TP_OK;
}

static tp_status_t s_set_hp(void *impl, const char *name, double v) {
    if (strcmp(name, "learning_rate"))
        return tp_error(TP_ERR_NOT_FOUND, "no hyper-parameter %s", name);
    ((s_train_t *)impl)->lr = v;
    return TP_OK;
}

static tp_status_t s_get_hp(void *impl, const char *name, double *v) {
    if (strcmp(name, "learning_rate"))
        return tp_error(TP_ERR_NOT_FOUND, "no hyper-parameter %s", name);
    *v = ((s_train_t *)impl)->lr;
    return TP_OK;
}

static int64_t s_sps(void *impl) { return 32; }

static const tp_trainer_ops_t s_ops = {
    .name = "test", .run_step = s_run_step, .set_hyperparam = s_set_hp,
    .get_hyperparam = s_get_hp, .samples_per_step = s_sps,
};

/* The trainer does not own s_train_t here (no destroy): tests read it. */
static tp_trainer_t *s_trainer(s_train_t *t) {
    memset(t, 0, sizeof *t);
    t->lr = 0.5;
    return tp_trainer_new(&s_ops, t);
}

typedef struct {
    s_train_t *t;
    const char *tag;
    int stop_at_global_step;
    int fail_trigger_epoch;
    int stop_trigger_epoch;  /* epoch whose trigger_epoch requests a stop, 0 never */
    double last_loss;
    int got_loss, missing_unasked;
} s_rec_t;

#define REC(hook)                                                             \
    static tp_status_t rec_##hook(void *impl, tp_trainer_t *tr) {             \
        s_rec_t *r = impl;                                                    \
        char b[64];                                                           \
        snprintf(b, sizeof b, "%s:" #hook, r->tag);                           \
        s_log(r->t, b);                                                       \
        return TP_OK;                                                         \
    }
REC(setup_graph)
REC(before_train)
REC(before_epoch)
REC(after_epoch)
REC(after_train)

static tp_status_t rec_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    char b[64];
    snprintf(b, sizeof b, "%s:trigger_epoch", r->tag);
    s_log(r->t, b);
    if (r->fail_trigger_epoch && tp_trainer_epoch_num(tr) == r->fail_trigger_epoch)
        return tp_error(TP_ERR_IO, "injected trigger failure");
    if (r->stop_trigger_epoch && tp_trainer_epoch_num(tr) == r->stop_trigger_epoch)
        tp_trainer_request_stop(tr, "stopped at the epoch's end", 0);
    return TP_OK;
}

static tp_status_t rec_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_rec_t *r = impl;
    char b[64];
    snprintf(b, sizeof b, "%s:before_run", r->tag);
    s_log(r->t, b);
    return tp_fetches_request(f, "loss");
}

static tp_status_t rec_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_rec_t *r = impl;
    char b[64];
    snprintf(b, sizeof b, "%s:after_run", r->tag);
    s_log(r->t, b);
    r->got_loss = tp_fetches_get(f, "loss", &r->last_loss) == TP_OK;
    double x;
    r->missing_unasked = tp_fetches_get(f, "unasked", &x) == TP_ERR_NOT_FOUND;
    return TP_OK;
}

static tp_status_t rec_trigger_step(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    char b[64];
    snprintf(b, sizeof b, "%s:trigger_step", r->tag);
    s_log(r->t, b);
    if (r->stop_at_global_step && tp_trainer_global_step(tr) == r->stop_at_global_step)
        tp_trainer_request_stop(tr, "test asked", 0);
    return TP_OK;
}

static const tp_callback_ops_t s_rec_ops = {
    .name = "Recorder",
    .setup_graph = rec_setup_graph, .before_train = rec_before_train,
    .before_epoch = rec_before_epoch, .before_run = rec_before_run,
    .after_run = rec_after_run, .trigger_step = rec_trigger_step,
    .after_epoch = rec_after_epoch, .trigger_epoch = rec_trigger_epoch,
    .after_train = rec_after_train,
};

static tp_callback_t *s_rec(s_rec_t *r, s_train_t *t, const char *tag) {
    memset(r, 0, sizeof *r);
    r->t = t;
    r->tag = tag;
    return tp_callback_new(&s_rec_ops, r, 0);
}

static tp_schedule_t s_sched(int64_t start, int64_t max, int64_t steps) {
    return (tp_schedule_t){.starting_epoch = start, .max_epoch = max, .steps_per_epoch = steps};
}

/* ---- hook order and counting ------------------------------------------------ */

Test(trainer, hook_order_follows_tensorpack) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_rec_t a, b;
    tp_callback_t *ca = s_rec(&a, &t, "A"), *cb = s_rec(&b, &t, "B");
    cr_assert_eq(tp_trainer_add_callback(tr, &ca), TP_OK);
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    cr_assert_null(ca);
    tp_schedule_t s = s_sched(1, 2, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    const char *step =
        "A:before_run B:before_run step A:after_run B:after_run A:trigger_step B:trigger_step";
    char expect[4096];
    snprintf(expect, sizeof expect,
             "A:setup_graph B:setup_graph A:before_train B:before_train "
             "A:before_epoch B:before_epoch %s %s A:after_epoch B:after_epoch "
             "A:trigger_epoch B:trigger_epoch "
             "A:before_epoch B:before_epoch %s %s A:after_epoch B:after_epoch "
             "A:trigger_epoch B:trigger_epoch A:after_train B:after_train",
             step, step, step, step);
    cr_assert_str_eq(t.log, expect);
    cr_assert_eq(tp_trainer_global_step(tr), 4);
    cr_assert_eq(tp_trainer_epoch_num(tr), 2);
    cr_assert(a.got_loss && a.missing_unasked);
    cr_assert_float_eq(a.last_loss, 0.25, 1e-12, "loss of global step 4");
    tp_trainer_destroy(&tr);
}

Test(trainer, resumed_schedule_counts_global_step) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_schedule_t s = s_sched(3, 5, 7);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    cr_assert_eq(t.steps, 21, "epochs 3, 4, 5 of 7 steps");
    cr_assert_eq(tp_trainer_global_step(tr), 35, "(3-1)*7 + 21");
    tp_trainer_destroy(&tr);
}

Test(trainer, bad_schedule_is_refused) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_schedule_t s = s_sched(0, 5, 7);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "starting_epoch 0"));
    s = s_sched(1, 5, 0);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_INVALID);
    cr_assert_eq(t.steps, 0);
    tp_trainer_destroy(&tr);
}

Test(trainer, failed_step_still_runs_after_train) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    t.fail_at_step = 3;
    s_rec_t a;
    tp_callback_t *ca = s_rec(&a, &t, "A");
    tp_trainer_add_callback(tr, &ca);
    tp_schedule_t s = s_sched(1, 3, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), "step 0 of epoch 2: injected step failure"),
              "%s", tp_last_error());
    cr_assert(strstr(t.log, "A:after_train"), "after_train runs after an error");
    /* epoch 2 never ended */
    const char *e2 = strstr(t.log, "A:trigger_epoch");
    cr_assert(e2 && !strstr(e2 + 1, "A:trigger_epoch"));
    tp_trainer_destroy(&tr);
}

Test(trainer, failing_hook_stops_and_keeps_the_first_error) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_rec_t a, b;
    tp_callback_t *ca = s_rec(&a, &t, "A"), *cb = s_rec(&b, &t, "B");
    a.fail_trigger_epoch = 1;
    tp_trainer_add_callback(tr, &ca);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 3, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), "callback Recorder: trigger_epoch: injected trigger failure"),
              "%s", tp_last_error());
    cr_assert_null(strstr(t.log, "B:trigger_epoch"), "later hooks of that round are skipped");
    cr_assert(strstr(t.log, "A:after_train B:after_train"));
    cr_assert_eq(t.steps, 1);
    tp_trainer_destroy(&tr);
}

Test(trainer, a_callback_can_stop_training) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_rec_t a;
    tp_callback_t *ca = s_rec(&a, &t, "A");
    a.stop_at_global_step = 5;
    tp_trainer_add_callback(tr, &ca);
    tp_schedule_t s = s_sched(1, 10, 3);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    cr_assert_eq(t.steps, 5);
    cr_assert_str_eq(tp_trainer_stop_reason(tr), "test asked");
    cr_assert(strstr(t.log, "A:after_train"));
    tp_trainer_destroy(&tr);
}

/* A stop asked for at the epoch's end (EarlyStopping on a metric) lets that
 * end finish: every later callback's trigger_epoch of the epoch runs (its
 * statistics written, its checkpoint saved), no further epoch starts, and
 * after_train runs (docs/callbacks.md, trainer_loop.h). */
Test(trainer, a_stop_in_trigger_epoch_finishes_that_epoch_end_only) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_rec_t a, b;
    tp_callback_t *ca = s_rec(&a, &t, "A"), *cb = s_rec(&b, &t, "B");
    a.stop_trigger_epoch = 1;
    tp_trainer_add_callback(tr, &ca);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 3, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    cr_assert_eq(t.steps, 2);
    const char *p = strstr(t.log, "A:trigger_epoch B:trigger_epoch A:after_train B:after_train");
    cr_assert(p, "%s", t.log);
    cr_assert_null(strstr(strstr(t.log, "A:before_epoch") + 1, "A:before_epoch"),
                   "a second epoch started: %s", t.log);
    tp_trainer_destroy(&tr);
}

Test(trainer, an_interrupt_returns_interrupted) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_trainer_request_stop(tr, "SIGINT", 1);
    tp_schedule_t s = s_sched(1, 2, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_INTERRUPTED);
    cr_assert(strstr(tp_last_error(), "SIGINT"));
    cr_assert_eq(t.steps, 0);
    tp_trainer_destroy(&tr);
}

Test(trainer, chief_only_callbacks_skip_other_ranks) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_trainer_set_chief(tr, 0);
    s_rec_t a;
    memset(&a, 0, sizeof a);
    a.t = &t;
    a.tag = "A";
    tp_callback_t *ca = tp_callback_new(&s_rec_ops, &a, 1);
    cr_assert_eq(tp_trainer_add_callback(tr, &ca), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 1);
    tp_trainer_train(tr, &s);
    cr_assert_null(strstr(t.log, "A:"), "%s", t.log);
    tp_trainer_destroy(&tr);
}

/* ---- wrappers ------------------------------------------------------------------ */

typedef struct { int triggers; int epochs; } s_count_t;
static tp_status_t cnt_trigger(void *impl, tp_trainer_t *tr) {
    ((s_count_t *)impl)->triggers++;
    return TP_OK;
}
static tp_status_t cnt_after_epoch(void *impl, tp_trainer_t *tr) {
    ((s_count_t *)impl)->epochs++;
    return TP_OK;
}
static const tp_callback_ops_t s_cnt_ops = {
    .name = "Counter", .trigger = cnt_trigger, .after_epoch = cnt_after_epoch};

static int s_even_epochs(tp_trainer_t *tr, void *arg) {
    return tp_trainer_epoch_num(tr) % 2 == 0;
}

Test(trainer, periodic_trigger_and_friends) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_count_t by_step = {0}, by_epoch = {0}, plain = {0}, periodic = {0}, gated = {0};
    tp_callback_t *c1 = tp_cb_periodic_trigger(tp_callback_new(&s_cnt_ops, &by_step, 0), 3, 0);
    tp_callback_t *c2 = tp_cb_periodic_trigger(tp_callback_new(&s_cnt_ops, &by_epoch, 0), 0, 2);
    tp_callback_t *c3 = tp_callback_new(&s_cnt_ops, &plain, 0);
    tp_callback_t *c4 = tp_cb_periodic_callback(tp_callback_new(&s_cnt_ops, &periodic, 0), 2);
    tp_callback_t *c5 = tp_cb_enable_if(tp_callback_new(&s_cnt_ops, &gated, 0), s_even_epochs, NULL);
    tp_trainer_add_callback(tr, &c1);
    tp_trainer_add_callback(tr, &c2);
    tp_trainer_add_callback(tr, &c3);
    tp_trainer_add_callback(tr, &c4);
    tp_trainer_add_callback(tr, &c5);
    tp_schedule_t s = s_sched(1, 5, 2); /* 10 steps */
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    cr_assert_eq(by_step.triggers, 3, "global steps 3, 6, 9");
    cr_assert_eq(by_step.epochs, 5, "other hooks still run");
    cr_assert_eq(by_epoch.triggers, 2, "epochs 2 and 4");
    cr_assert_eq(plain.triggers, 5, "trigger_epoch defaults to trigger");
    cr_assert_eq(periodic.triggers, 2);
    cr_assert_eq(periodic.epochs, 2);
    cr_assert_eq(gated.epochs, 2);
    tp_callback_t *bad = tp_cb_periodic_trigger(tp_callback_new(&s_cnt_ops, &plain, 0), 0, 0);
    cr_assert_null(bad);
    cr_assert(strstr(tp_last_error(), "at least one positive period"));
    tp_trainer_destroy(&tr);
}

/* ---- hyper-parameters -------------------------------------------------------- */

Test(trainer, scheduled_hyperparam_after_epochs) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_hp_point_t pts[] = {{0, 0.1}, {2, 0.01}, {4, 0.001}};
    tp_callback_t *cb = tp_cb_hp_schedule("learning_rate", pts, 3, 0, 0);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 1, 1);
    tp_trainer_train(tr, &s);
    cr_assert_float_eq(t.lr, 0.1, 1e-12, "point 0 applies before epoch 1");
    tp_trainer_destroy(&tr);

    tr = s_trainer(&t);
    cb = tp_cb_hp_schedule("learning_rate", pts, 3, 0, 0);
    tp_trainer_add_callback(tr, &cb);
    s = s_sched(1, 2, 1);
    tp_trainer_train(tr, &s);
    cr_assert_float_eq(t.lr, 0.01, 1e-12, "after epoch 2 completes");
    double v;
    cr_assert_eq(tp_trainer_get_scalar(tr, "learning_rate", &v), TP_OK);
    cr_assert_float_eq(v, 0.01, 1e-12, "the setter reports the value as a scalar");
    tp_trainer_destroy(&tr);

    /* Resume at epoch 4: the value of the last point before it. */
    tr = s_trainer(&t);
    cb = tp_cb_hp_schedule("learning_rate", pts, 3, 0, 0);
    tp_trainer_add_callback(tr, &cb);
    s = s_sched(4, 3, 1); /* nothing to run: only before_train */
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_float_eq(t.lr, 0.01, 1e-12);
    tp_trainer_destroy(&tr);
}

Test(trainer, scheduled_hyperparam_interpolates) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_hp_point_t pts[] = {{0, 1.0}, {4, 0.0}};
    tp_callback_t *cb = tp_cb_hp_schedule("learning_rate", pts, 2, 1, 0);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 3, 1);
    tp_trainer_train(tr, &s);
    cr_assert_float_eq(t.lr, 0.25, 1e-12);
    tp_trainer_destroy(&tr);
    /* step based */
    tr = s_trainer(&t);
    tp_hp_point_t steps[] = {{0, 1.0}, {10, 2.0}};
    cb = tp_cb_hp_schedule("learning_rate", steps, 2, 1, 1);
    tp_trainer_add_callback(tr, &cb);
    s = s_sched(1, 1, 5);
    tp_trainer_train(tr, &s);
    cr_assert_float_eq(t.lr, 1.5, 1e-12, "global step 5 of 10");
    tp_trainer_destroy(&tr);
    tp_hp_point_t bad[] = {{2, 1.0}, {1, 0.0}};
    cr_assert_null(tp_cb_hp_schedule("learning_rate", bad, 2, 0, 0));
    cr_assert(strstr(tp_last_error(), "strictly increasing"));
}

/* The common recipes' schedules (tp_cb_lr_schedule): each step runs at
 * tp_lr_schedule_at(its global step), also after a resume; bad schedules
 * are refused naming the field. (Against PyTorch: test_proc_lr_schedule.) */
Test(trainer, lr_schedule_sets_each_steps_rate) {
    tp_lr_schedule_t cos = {.kind = TP_LR_COSINE, .base = 0.1, .warmup_from = 0.1,
                            .end = 0.01, .warmup = 3, .total = 10};
    cr_assert_eq(tp_lr_schedule_check(&cos), TP_OK, "%s", tp_last_error());
    cr_expect_float_eq(tp_lr_schedule_at(&cos, 0), 0.01, 1e-15, "the warm-up's start");
    cr_expect_float_eq(tp_lr_schedule_at(&cos, 3), 0.1, 1e-15, "the peak after it");
    cr_expect_float_eq(tp_lr_schedule_at(&cos, 10), 0.001, 1e-15, "base x end at total");
    cr_expect_float_eq(tp_lr_schedule_at(&cos, 99), 0.001, 1e-15, "and after it");
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_callback_t *cb = tp_cb_lr_schedule("learning_rate", &cos);
    cr_assert_not_null(cb, "%s", tp_last_error());
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 2, 5);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(t.steps, 10);
    for (int k = 0; k < 10; k++)
        cr_expect_float_eq(t.step_lr[k], tp_lr_schedule_at(&cos, k), 1e-15, "step %d", k);
    tp_trainer_destroy(&tr);

    /* resumed at epoch 2: global step 5 on, at the rates of steps 5..9 */
    tr = s_trainer(&t);
    cb = tp_cb_lr_schedule("learning_rate", &cos);
    tp_trainer_add_callback(tr, &cb);
    s = s_sched(2, 2, 5);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(t.steps, 5);
    for (int k = 0; k < 5; k++)
        cr_expect_float_eq(t.step_lr[k], tp_lr_schedule_at(&cos, 5 + k), 1e-15, "step %d", k);
    tp_trainer_destroy(&tr);
    s = s_sched(1, 2, 5);

    /* step decay: x 0.5 at steps 4 and 8, after a 2-step warm-up */
    tp_lr_schedule_t st = {.kind = TP_LR_STEP, .base = 1, .warmup_from = 0.5, .gamma = 0.5,
                           .warmup = 2, .milestones = {4, 8}, .nmilestones = 2};
    const double want[10] = {0.5, 0.75, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25};
    tr = s_trainer(&t);
    cb = tp_cb_lr_schedule("learning_rate", &st);
    tp_trainer_add_callback(tr, &cb);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    for (int k = 0; k < 10; k++)
        cr_expect_float_eq(t.step_lr[k], want[k], 1e-15, "step %d", k);
    tp_trainer_destroy(&tr);

    /* bad schedules, named */
    tp_lr_schedule_t bad = cos;
    bad.warmup = 10;
    cr_expect_null(tp_cb_lr_schedule("learning_rate", &bad));
    cr_expect(strstr(tp_last_error(), "warm-up of 10 steps"), "%s", tp_last_error());
    bad = st;
    bad.milestones[1] = 4;
    cr_expect_null(tp_cb_lr_schedule("learning_rate", &bad));
    cr_expect(strstr(tp_last_error(), "increasing"), "%s", tp_last_error());
    bad = cos;
    bad.warmup_from = 0;
    cr_expect_eq(tp_lr_schedule_check(&bad), TP_ERR_INVALID);
    bad = cos;
    bad.end = 1.5;
    cr_expect_eq(tp_lr_schedule_check(&bad), TP_ERR_INVALID);
}

static double s_halve(int64_t epoch, double cur, void *arg) { return cur / 2; }

Test(trainer, hyperparam_with_func_and_unknown_param) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_callback_t *cb = tp_cb_hp_func("learning_rate", s_halve, NULL);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 3, 1);
    tp_trainer_train(tr, &s);
    cr_assert_float_eq(t.lr, 0.5 / 16, 1e-12, "before_train and 3 epochs");
    tp_trainer_destroy(&tr);
    tr = s_trainer(&t);
    cb = tp_cb_hp_func("momentum", s_halve, NULL);
    tp_trainer_add_callback(tr, &cb);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_last_error(), "momentum"));
    tp_trainer_destroy(&tr);
}

static const double s_val_losses[] = {1.0, 0.8, 0.79, 0.79, 0.795, 0.5, 0.5, 0.5, 0.5, 0.5};
static tp_status_t val_trigger_epoch(void *impl, tp_trainer_t *tr) {
    tp_trainer_put_scalar(tr, "val_loss", s_val_losses[tp_trainer_epoch_num(tr) - 1]);
    return TP_OK;
}
static const tp_callback_ops_t s_val_ops = {.name = "Val", .trigger_epoch = val_trigger_epoch};

Test(trainer, stat_monitor_param_setter) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_callback_t *val = tp_callback_new(&s_val_ops, NULL, 0);
    tp_callback_t *cb = tp_cb_hp_stat_monitor("learning_rate", "val_loss", s_halve,
                                              NULL, 0.05, 2, 0);
    tp_trainer_add_callback(tr, &val);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 10, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    /* epoch 4: window 0.8, 0.79, 0.79: no improvement > 0.05 -> halve.
     * epochs 5, 6: waiting. epoch 7: window 0.795, 0.5, 0.5 improved.
     * epoch 8: 0.5 0.5 0.5 -> halve. epochs 9, 10 wait. */
    cr_assert_float_eq(t.lr, 0.5 / 4, 1e-12, "lr %g", t.lr);
    tp_trainer_destroy(&tr);
}

/* ---- guards and monitors -------------------------------------------------------- */

Test(trainer, check_numerics_stops_with_a_clear_message) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    t.nan_at_step = 6;
    tp_callback_t *cb = tp_cb_check_numerics("loss", 1);
    tp_trainer_add_callback(tr, &cb);
    tp_schedule_t s = s_sched(1, 5, 4);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "loss is NaN at global step 6 (epoch 2, step 1)"),
              "%s", tp_last_error());
    cr_assert_eq(t.steps, 6);
    tp_trainer_destroy(&tr);
}

static char *s_tmpdir(void) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-trainer-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static tp_status_t loss_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    double v;
    if (tp_fetches_get(f, "loss", &v) == TP_OK)
        tp_trainer_put_scalar(tr, "loss", v);
    return TP_OK;
}
static tp_status_t loss_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    return tp_fetches_request(f, "loss");
}
static const tp_callback_ops_t s_loss_ops = {
    .name = "LossToScalar", .before_run = loss_before_run, .after_run = loss_after_run};

static json_t *s_load(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    return j;
}

static void s_run_json(const char *dir, int64_t start, int64_t max, s_train_t *t) {
    tp_trainer_t *tr = s_trainer(t);
    tp_trainer_set_logdir(tr, dir);
    tp_callback_t *l = tp_callback_new(&s_loss_ops, NULL, 0);
    tp_callback_t *j = tp_cb_json_writer();
    tp_trainer_add_callback(tr, &l);
    tp_trainer_add_callback(tr, &j);
    tp_schedule_t s = s_sched(start, max, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    tp_trainer_destroy(&tr);
}

Test(trainer, json_writer_writes_and_resumes) {
    char *dir = s_tmpdir();
    s_train_t t;
    s_run_json(dir, 1, 3, &t);
    json_t *j = s_load(dir);
    cr_assert_eq(json_array_size(j), 3);
    json_t *last = json_array_get(j, 2);
    cr_assert_eq(json_integer_value(json_object_get(last, "epoch_num")), 3);
    cr_assert_eq(json_integer_value(json_object_get(last, "global_step")), 6);
    cr_assert_float_eq(json_real_value(json_object_get(last, "loss")), 1.0 / 6, 1e-9);
    json_decref(j);
    /* Resume from epoch 3 (the checkpoint after epoch 2): the old record of
     * epoch 3 is replaced, not duplicated. */
    s_run_json(dir, 3, 4, &t);
    j = s_load(dir);
    cr_assert_eq(json_array_size(j), 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(j, (size_t)i), "epoch_num")), i + 1);
    json_decref(j);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int leftovers = -1;
    cr_assert_eq(fscanf(p, "%d", &leftovers), 1);
    pclose(p);
    cr_assert_eq(leftovers, 0, "no temporary files left");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(trainer, json_writer_rejects_a_corrupt_file) {
    char *dir = s_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    FILE *f = fopen(path, "w");
    fputs("[{\"epoch_num\": 1,", f);
    fclose(f);
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_trainer_set_logdir(tr, dir);
    tp_callback_t *j = tp_cb_json_writer();
    tp_trainer_add_callback(tr, &j);
    tp_schedule_t s = s_sched(2, 3, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "stats.json: line 1"), "%s", tp_last_error());
    cr_assert_eq(t.steps, 0);
    tp_trainer_destroy(&tr);
    unlink(path);
    rmdir(dir);
}

Test(trainer, json_writer_reports_an_unwritable_directory) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_trainer_set_logdir(tr, "/proc/tp-no-such-dir");
    tp_callback_t *j = tp_cb_json_writer();
    tp_trainer_add_callback(tr, &j);
    tp_schedule_t s = s_sched(1, 2, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), "JSONWriter: creating /proc/tp-no-such-dir/stats.json"),
              "%s", tp_last_error());
    tp_trainer_destroy(&tr);
}

Test(trainer, progress_bar_plain_lines_and_throughput) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    tp_callback_t *l = tp_callback_new(&s_loss_ops, NULL, 0);
    tp_callback_t *pb = tp_cb_progress_bar("loss", out);
    tp_callback_t *tp = tp_cb_throughput();
    tp_trainer_add_callback(tr, &l);
    tp_trainer_add_callback(tr, &pb);
    tp_trainer_add_callback(tr, &tp);
    tp_schedule_t s = s_sched(1, 2, 100);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK);
    fclose(out);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    cr_assert_eq(lines, 20, "9 progress lines + 1 final per epoch:\n%s", buf);
    cr_assert(strstr(buf, "epoch 2/2 [########################] 100/100"), "%s", buf);
    cr_assert(strstr(buf, "loss=0.005"), "%s", buf);
    cr_assert(strstr(buf, "samples/s"));
    free(buf);
    double v;
    cr_assert_eq(tp_trainer_get_scalar(tr, "throughput", &v), TP_OK);
    cr_assert(v > 0);
    cr_assert_eq(tp_trainer_get_scalar(tr, "steps_per_s", &v), TP_OK);
    tp_trainer_destroy(&tr);
}

Test(trainer, scalar_history_is_per_epoch) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    tp_callback_t *l = tp_callback_new(&s_loss_ops, NULL, 0);
    tp_trainer_add_callback(tr, &l);
    tp_schedule_t s = s_sched(1, 3, 10);
    tp_trainer_train(tr, &s);
    const double *h;
    size_t n;
    cr_assert_eq(tp_trainer_scalar_history(tr, "loss", &h, &n), TP_OK);
    cr_assert_eq(n, 3, "one entry per epoch, not per step");
    cr_assert_float_eq(h[2], 1.0 / 30, 1e-12);
    cr_assert_eq(tp_trainer_scalar_history(tr, "nothing", &h, &n), TP_ERR_NOT_FOUND);
    tp_trainer_destroy(&tr);
}

/* ---- sidecars: called by name at fixed points ---------------------------------- */

static s_train_t *s_sc_log;  /* the sidecar logs into the trainer's log */
static tp_status_t sc_start(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "S:start"); return TP_OK; }
static tp_status_t sc_poll(void *impl, tp_trainer_t *tr) {
    s_log(s_sc_log, "S:poll");
    /* what it sent back reaches the trainer here: a stop request */
    if (*(int *)impl && tp_trainer_global_step(tr) == *(int *)impl)
        tp_trainer_request_stop(tr, "the sidecar asked", 0);
    return TP_OK;
}
static tp_status_t sc_epoch_end(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "S:epoch_end"); return TP_OK; }
static tp_status_t sc_finish(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "S:finish"); return TP_OK; }
static void sc_destroy(void *impl) { s_log(s_sc_log, "S:destroy"); }
static const tp_sidecar_ops_t s_sc_ops = {
    .name = "Sidecar", .start = sc_start, .poll = sc_poll, .epoch_end = sc_epoch_end,
    .finish = sc_finish, .destroy = sc_destroy,
};

static int s_sc_stop_at;
static tp_status_t att_setup_graph(void *impl, tp_trainer_t *tr) {
    s_log(s_sc_log, "A:setup_graph");
    return tp_trainer_attach(tr, &s_sc_ops, &s_sc_stop_at);
}
static tp_status_t att_trigger_step(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "A:trigger_step"); return TP_OK; }
static tp_status_t att_trigger_epoch(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "A:trigger_epoch"); return TP_OK; }
static tp_status_t att_before_train(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "A:before_train"); return TP_OK; }
static tp_status_t att_after_train(void *impl, tp_trainer_t *tr) { s_log(s_sc_log, "A:after_train"); return TP_OK; }
static const tp_callback_ops_t s_att_ops = {
    .name = "Attacher", .setup_graph = att_setup_graph, .before_train = att_before_train,
    .trigger_step = att_trigger_step, .trigger_epoch = att_trigger_epoch,
    .after_train = att_after_train,
};

/* A sidecar attached by a setup_graph starts after every setup_graph and
 * before any before_train, is polled after each step's trigger_step, told
 * each epoch's end after trigger_epoch, finished after every after_train,
 * and destroyed with the trainer; a stop it passes on in poll ends
 * training after that step. */
Test(trainer, sidecars_run_at_named_points) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_sc_log = &t;
    s_sc_stop_at = 0;
    s_rec_t b;
    tp_callback_t *ca = tp_callback_new(&s_att_ops, NULL, 0), *cb = s_rec(&b, &t, "B");
    cr_assert_eq(tp_trainer_add_callback(tr, &ca), TP_OK);
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    tp_schedule_t s = s_sched(1, 2, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_trainer_sidecar(tr, &s_sc_ops), &s_sc_stop_at);
    const char *step = "B:before_run step B:after_run A:trigger_step B:trigger_step S:poll";
    char expect[4096];
    snprintf(expect, sizeof expect,
             "A:setup_graph B:setup_graph S:start A:before_train B:before_train "
             "B:before_epoch %s B:after_epoch A:trigger_epoch B:trigger_epoch S:epoch_end "
             "B:before_epoch %s B:after_epoch A:trigger_epoch B:trigger_epoch S:epoch_end "
             "A:after_train B:after_train S:finish", step, step);
    cr_assert_str_eq(t.log, expect);
    t.log[0] = '\0';
    tp_trainer_destroy(&tr);
    cr_assert_str_eq(t.log, "S:destroy");

    /* a stop request the sidecar passes on at a step boundary */
    tr = s_trainer(&t);
    s_sc_stop_at = 3;
    ca = tp_callback_new(&s_att_ops, NULL, 0);
    cr_assert_eq(tp_trainer_add_callback(tr, &ca), TP_OK);
    s = s_sched(1, 1, 10);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(t.steps, 3);
    cr_assert_str_eq(tp_trainer_stop_reason(tr), "the sidecar asked");
    cr_assert(strstr(t.log, "A:after_train S:finish"), "%s", t.log);
    tp_trainer_destroy(&tr);
}

static tp_status_t late_before_train(void *impl, tp_trainer_t *tr) {
    return tp_trainer_attach(tr, &s_sc_ops, NULL);
}
static const tp_callback_ops_t s_late_ops = {.name = "Late", .before_train = late_before_train};

Test(trainer, a_sidecar_attached_after_the_start_is_refused) {
    s_train_t t;
    tp_trainer_t *tr = s_trainer(&t);
    s_sc_log = &t;
    tp_callback_t *c = tp_callback_new(&s_late_ops, NULL, 0);
    cr_assert_eq(tp_trainer_add_callback(tr, &c), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 1);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "sidecar Sidecar not attached: training has begun"),
              "%s", tp_last_error());
    cr_assert(strstr(t.log, "S:destroy"), "refused, it is destroyed at once: %s", t.log);
    cr_assert_null(tp_trainer_sidecar(tr, &s_sc_ops));
    tp_trainer_destroy(&tr);
}

/* ---- a trainer that follows a loop run elsewhere ------------------------------- */

static tp_status_t s_no_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    return tp_error(TP_ERR_STATE, "no steps here");
}
static const tp_trainer_ops_t s_follower_ops = {.name = "follower", .run_step = s_no_step};

/* Its counters, schedule, hook time and scalar history are what it is
 * given; it refuses new callbacks; a stop request on it is its own. */
Test(trainer, a_follower_has_the_counters_it_is_given) {
    tp_trainer_t *f = tp_trainer_new(&s_follower_ops, NULL);
    tp_schedule_t s = s_sched(3, 5, 7);
    tp_trainer_follow(f, &s);
    tp_trainer_follow_at(f, 4, 2, 23, 12345);
    cr_assert_eq(tp_trainer_epoch_num(f), 4);
    cr_assert_eq(tp_trainer_local_step(f), 2);
    cr_assert_eq(tp_trainer_global_step(f), 23);
    cr_assert_eq(tp_trainer_hook_time_ns(f), 12345, "when the loop got there, not now");
    cr_assert_eq(tp_trainer_schedule(f)->steps_per_epoch, 7);
    tp_trainer_put_scalar(f, "x", 1.0);
    tp_trainer_follow_epoch_end(f);
    tp_trainer_put_scalar(f, "x", 2.0);
    tp_trainer_follow_epoch_end(f);
    const double *h;
    size_t n;
    cr_assert_eq(tp_trainer_scalar_history(f, "x", &h, &n), TP_OK);
    cr_assert_eq(n, 2);
    cr_assert_float_eq(h[1], 2.0, 0);
    s_rec_t r;
    s_train_t t;
    memset(&t, 0, sizeof t);
    tp_callback_t *c = s_rec(&r, &t, "R");
    cr_assert_eq(tp_trainer_add_callback(f, &c), TP_ERR_STATE);
    cr_assert_eq(tp_trainer_stop_requested(f), 0);
    tp_trainer_request_stop(f, "asked", 1);
    cr_assert_eq(tp_trainer_stop_requested(f), 2);
    cr_assert_str_eq(tp_trainer_stop_reason(f), "asked");
    tp_trainer_destroy(&f);
}

/* ---- log directory ------------------------------------------------------------------ */

Test(logdir, actions) {
    char *base = s_tmpdir();
    char dir[128], out[256], path[300];
    snprintf(dir, sizeof dir, "%s/run/a", base);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_ASK, out, sizeof out, NULL), TP_OK,
                 "a new directory needs no action");
    cr_assert_str_eq(out, dir);
    snprintf(path, sizeof path, "%s/x", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    /* Not a terminal: never a prompt, a clear error instead. */
    int saved = dup(0);
    FILE *devnull = freopen("/dev/null", "r", stdin);
    cr_assert_not_null(devnull);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_ASK, out, sizeof out, NULL), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "keep (resume), delete, backup or new"));
    dup2(saved, 0);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_KEEP, out, sizeof out, NULL), TP_OK);
    cr_assert_eq(access(path, F_OK), 0, "keep keeps the files");
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_NEW, out, sizeof out, NULL), TP_OK);
    snprintf(path, sizeof path, "%s-1", dir);
    cr_assert_str_eq(out, path);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_BACKUP, out, sizeof out, NULL), TP_OK);
    cr_assert_str_eq(out, dir);
    snprintf(path, sizeof path, "%s/x", dir);
    cr_assert_neq(access(path, F_OK), 0, "backup starts empty");
    f = fopen(path, "w");
    fclose(f);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_DELETE, out, sizeof out, NULL), TP_OK);
    cr_assert_neq(access(path, F_OK), 0);
    tp_logdir_action_t a;
    cr_assert_eq(tp_logdir_action_parse("Backup", &a), TP_OK);
    cr_assert_eq(a, TP_LOGDIR_BACKUP);
    cr_assert_eq(tp_logdir_action_parse("overwrite", &a), TP_ERR_INVALID);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    cr_assert_eq(system(cmd), 0);
}
