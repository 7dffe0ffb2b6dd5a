/* towerpack tests: observing callbacks on the callback actor
 * (tp_cb_observe, tp_cb_observe_latest). What must hold: an observer sees
 * tensorpack's hook order with the counters of the moment, exactly as the
 * same callback on the trainer's thread does (also from starting_epoch > 1),
 * but for the one before_run at setup that says what to fetch for it;
 * it gets the values it asked for; latest-only observers skip steps while
 * they are behind, observers of every step skip none; a failing observer
 * stops training with its message, its stop request stops it, and it
 * cannot set hyper-parameters; scalars cross both ways. The actor's thread
 * runs from after setup_graph to the end of training, and a trainer's
 * destroy returns only once it has ended, even past a stuck hook. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>
#include <towerpack/supervisor.h>  /* tp_signals_install */
#include "pipeline/trainer_internal.h"  /* tp_trainer_set_watchdog */
#include "train_testutil.h"

/* ---- a trainer whose step gives "loss" = 1 / global step ------------------- */

typedef struct {
    int64_t steps;
} s_train_t;

static tp_status_t s_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    ((s_train_t *)impl)->steps++;
    tp_fetches_set(f, "loss", 1.0 / (double)(tp_trainer_global_step(tr) + 1));
    return TP_OK;
}

static tp_status_t s_set_hp(void *impl, const char *name, double v) {
    (void)impl, (void)name, (void)v;
    return TP_OK;
}

static const tp_trainer_ops_t s_ops = {
    .name = "test", .run_step = s_run_step, .set_hyperparam = s_set_hp,
};

/* ---- a recording callback ---------------------------------------------------- */

typedef struct {
    char log[65536];
    const char *fetch;         /* what before_run asks for (NULL: "loss") */
    int sleep_step_us;         /* in trigger_step */
    int64_t hang_at;           /* trigger_step of this global step sleeps hang_us */
    int hang_us;
    int raise_at_hang;         /* ... after raising SIGINT */
    atomic_int hang_done;      /* that sleep is over */
    int64_t fail_at, stop_at;  /* global step of trigger_step (0: never) */
    int set_hp;                /* before_train sets a hyper-parameter */
    int put_and_read;          /* trigger_epoch: read "sync_metric", put "obs_metric" */
    int trigger_steps, after_trains;
    double seen_sync_metric, seen_obs_metric;
} s_rec_t;

static void s_log(s_rec_t *r, tp_trainer_t *tr, const char *what) {
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof r->log - n, "%s%s@%lld/%lld/%lld", n ? " " : "", what,
             (long long)tp_trainer_epoch_num(tr), (long long)tp_trainer_local_step(tr),
             (long long)tp_trainer_global_step(tr));
}

#define REC(hook)                                                  \
    static tp_status_t rec_##hook(void *impl, tp_trainer_t *tr) { \
        s_log(impl, tr, #hook);                                    \
        return TP_OK;                                              \
    }
REC(setup_graph)
REC(before_epoch)
REC(after_epoch)

static tp_status_t rec_before_train(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    s_log(r, tr, "before_train");
    return r->set_hp ? tp_trainer_set_hyperparam(tr, "learning_rate", 0.1) : TP_OK;
}

static tp_status_t rec_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    const s_rec_t *r = impl;
    s_log(impl, tr, "before_run");
    return tp_fetches_request(f, r->fetch ? r->fetch : "loss");
}

static tp_status_t rec_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    const s_rec_t *r = impl;
    double loss = NAN;
    tp_fetches_get(f, r->fetch ? r->fetch : "loss", &loss);
    char b[64];
    snprintf(b, sizeof b, "after_run(%.6g)", loss);
    s_log(impl, tr, b);
    return TP_OK;
}

static tp_status_t rec_trigger_step(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    s_log(r, tr, "trigger_step");
    r->trigger_steps++;
    if (r->sleep_step_us)
        usleep((useconds_t)r->sleep_step_us);
    if (r->hang_at && tp_trainer_global_step(tr) == r->hang_at) {
        if (r->raise_at_hang)
            raise(SIGINT);
        usleep((useconds_t)r->hang_us);
        atomic_store(&r->hang_done, 1);
    }
    if (r->fail_at && tp_trainer_global_step(tr) == r->fail_at)
        return tp_error(TP_ERR_IO, "injected failure at step %lld",
                        (long long)r->fail_at);
    if (r->stop_at && tp_trainer_global_step(tr) == r->stop_at)
        tp_trainer_request_stop(tr, "the observer asked", 0);
    return TP_OK;
}

static tp_status_t rec_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    s_log(r, tr, "trigger_epoch");
    if (r->put_and_read) {
        tp_trainer_get_scalar(tr, "sync_metric", &r->seen_sync_metric);
        tp_trainer_put_scalar(tr, "obs_metric", 100.0 + (double)tp_trainer_epoch_num(tr));
    }
    return TP_OK;
}

static tp_status_t rec_after_train(void *impl, tp_trainer_t *tr) {
    s_rec_t *r = impl;
    s_log(r, tr, "after_train");
    r->after_trains++;
    return TP_OK;
}

static void rec_on_scalar(void *impl, tp_trainer_t *tr, const char *name, double v) {
    (void)tr;
    if (!strcmp(name, "obs_metric"))
        ((s_rec_t *)impl)->seen_obs_metric = v;
}

static const tp_callback_ops_t s_rec_ops = {
    .name = "Recorder",
    .setup_graph = rec_setup_graph, .before_train = rec_before_train,
    .before_epoch = rec_before_epoch, .before_run = rec_before_run,
    .after_run = rec_after_run, .trigger_step = rec_trigger_step,
    .after_epoch = rec_after_epoch, .trigger_epoch = rec_trigger_epoch,
    .after_train = rec_after_train, .on_scalar = rec_on_scalar,
};

static s_rec_t *s_rec_new(void) {
    s_rec_t *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    return r;
}

/* A sync callback that puts "sync_metric" after each epoch. */
static tp_status_t put_after_epoch(void *impl, tp_trainer_t *tr) {
    (void)impl;
    tp_trainer_put_scalar(tr, "sync_metric", (double)tp_trainer_epoch_num(tr));
    return TP_OK;
}
static const tp_callback_ops_t s_put_ops = {.name = "Putter", .after_epoch = put_after_epoch};

static tp_status_t s_add(tp_trainer_t *tr, tp_callback_t *cb) {
    return tp_trainer_add_callback(tr, &cb);
}

static tp_schedule_t s_sched(int64_t start, int64_t max, int64_t steps) {
    return (tp_schedule_t){.starting_epoch = start, .max_epoch = max, .steps_per_epoch = steps};
}

/* ---- tests --------------------------------------------------------------------- */

Test(callback_actor, observer_sees_the_order_and_counters_of_a_synchronous_callback) {
    for (int latest = 0; latest < 2; latest++) {
        s_train_t t = {0};
        tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
        s_rec_t *sync = s_rec_new(), *obs = s_rec_new();
        cr_assert_eq(s_add(tr, tp_callback_new(&s_rec_ops, sync, 0)), TP_OK);
        tp_callback_t *o = tp_callback_new(&s_rec_ops, obs, 0);
        /* latest with no interval and a fast actor still may skip: only
         * the every-step observer must match step for step */
        cr_assert_eq(s_add(tr, latest ? tp_cb_observe_latest(o, 0) : tp_cb_observe(o)), TP_OK);
        tp_schedule_t s = s_sched(2, 4, 3);  /* resumed: starts at epoch 2 */
        cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
        if (!latest) {
            /* the same, but for the one before_run at setup that tells
             * which names to fetch for it */
            const char *head = "setup_graph@1/0/3 ";
            cr_assert(!strncmp(sync->log, head, strlen(head)), "%s", sync->log);
            char expect[sizeof sync->log + 32];
            snprintf(expect, sizeof expect, "%sbefore_run@1/0/3 %s", head,
                     sync->log + strlen(head));
            cr_assert_str_eq(obs->log, expect);
        } else {
            /* every epoch and training hook, in order; steps may be fewer */
            cr_assert(strstr(obs->log, "before_train@1/0/3"), "%s", obs->log);
            cr_assert(strstr(obs->log, "after_epoch@4/3/12 trigger_epoch@4/3/12 after_train@4/3/12"),
                      "%s", obs->log);
            cr_assert_leq(obs->trigger_steps, 9);
        }
        /* the sequence itself: tensorpack's order, global step from (2-1)*3 */
        cr_assert(strstr(sync->log,
                         "setup_graph@1/0/3 before_train@1/0/3 before_epoch@2/0/3 "
                         "before_run@2/0/3 after_run(0.25)@2/0/4 trigger_step@2/0/4 "
                         "before_run@2/1/4 after_run(0.2)@2/1/5"),
                  "%s", sync->log);
        cr_assert_eq(t.steps, 9);
        tp_trainer_destroy(&tr);
        free(sync);
        free(obs);
    }
}

Test(callback_actor, latest_only_observer_skips_steps_while_behind) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *slow = s_rec_new(), *every = s_rec_new();
    slow->sleep_step_us = 20000;  /* 20 ms a step; the trainer's step is ~1 us */
    cr_assert_eq(s_add(tr, tp_cb_observe_latest(tp_callback_new(&s_rec_ops, slow, 0), 0)), TP_OK);
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, every, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 2, 100);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(every->trigger_steps, 200, "the every-step observer misses none");
    cr_assert_lt(slow->trigger_steps, 200, "the latest-only one skipped (%d)", slow->trigger_steps);
    cr_assert_geq(slow->trigger_steps, 1);
    cr_assert_eq(slow->after_trains, 1);
    cr_assert(strstr(slow->log, "after_epoch@1/100/100 trigger_epoch@1/100/100"), "%s", slow->log);
    cr_assert(strstr(slow->log, "after_epoch@2/100/200 trigger_epoch@2/100/200 after_train"));
    tp_trainer_destroy(&tr);
    free(slow);
    free(every);
}

Test(callback_actor, failing_observer_stops_training_with_its_message) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *sync = s_rec_new(), *obs = s_rec_new();
    obs->fail_at = 3;
    cr_assert_eq(s_add(tr, tp_callback_new(&s_rec_ops, sync, 0)), TP_OK);
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 3, 1000);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_IO);
    const char *e = tp_last_error();
    cr_assert(strstr(e, "callback Recorder: trigger_step") && strstr(e, "injected failure at step 3") &&
              strstr(e, "observing callback") && strstr(e, "global step 3"), "%s", e);
    cr_assert_lt(t.steps, 3000, "stopped early (%lld steps)", (long long)t.steps);
    cr_assert_eq(sync->after_trains, 1);
    cr_assert_eq(obs->after_trains, 1, "after_train still runs on the actor");
    cr_assert_eq(obs->trigger_steps, 3, "nothing after the failure but after_train");
    tp_trainer_destroy(&tr);
    free(sync);
    free(obs);
}

/* An observer stuck in a hook is named by the watchdog (its heartbeat:
 * the hook it is in, since when), while training goes on without it. */
Test(callback_actor, watchdog_names_an_observer_stuck_in_a_hook) {
    char dir[] = "/tmp/tp-cb-watchdog-XXXXXX", log[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/log", dir);
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_log_level_t level = tp_log_get_level();
    tp_log_set_level(TP_LOG_WARN);
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    tp_trainer_set_watchdog(tr, 0.2);
    s_rec_t *obs = s_rec_new();
    obs->hang_at = 2;
    obs->hang_us = 1200000;  /* 6 periods */
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 5);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    tp_log_set_file(NULL);
    tp_log_set_level(level);
    cr_assert_eq(obs->after_trains, 1);
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    char buf[8192] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_assert(strstr(buf, "callback watchdog") && strstr(buf, "Recorder.trigger_step") &&
              strstr(buf, "global step 2"), "the log:\n%s", buf);
    tp_trainer_destroy(&tr);
    free(obs);
    unlink(log);
    rmdir(dir);
}

Test(callback_actor, observer_stop_request_ends_training) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *obs = s_rec_new();
    obs->stop_at = 5;
    obs->sleep_step_us = 1000;  /* the actor is behind the trainer */
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 100000);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(tp_trainer_stop_reason(tr), "the observer asked");
    cr_assert_lt(t.steps, 100000, "stopped (%lld steps)", (long long)t.steps);
    cr_assert_geq(t.steps, 5);
    cr_assert(!strstr(obs->log, "after_epoch"), "a stopped epoch does not end: %s", obs->log);
    tp_trainer_destroy(&tr);
    free(obs);
}

Test(callback_actor, observer_cannot_set_hyperparameters) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *obs = s_rec_new();
    obs->set_hp = 1;
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 2, 1000);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "observing callback cannot set hyper-parameter "
                                      "'learning_rate'"), "%s", tp_last_error());
    tp_trainer_destroy(&tr);
    free(obs);
}

Test(callback_actor, scalars_cross_both_ways) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *sync = s_rec_new(), *obs = s_rec_new();
    obs->put_and_read = 1;
    cr_assert_eq(s_add(tr, tp_callback_new(&s_put_ops, NULL, 0)), TP_OK);
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    cr_assert_eq(s_add(tr, tp_callback_new(&s_rec_ops, sync, 0)), TP_OK);
    tp_schedule_t s = s_sched(1, 3, 10);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    /* the observer read what a synchronous callback put before its hook */
    cr_assert_float_eq(obs->seen_sync_metric, 3.0, 0);
    /* what the observer put reached the trainer's store and its callbacks */
    double v = 0;
    cr_assert_eq(tp_trainer_get_scalar(tr, "obs_metric", &v), TP_OK);
    cr_assert_float_eq(v, 103.0, 0);
    cr_assert_float_eq(sync->seen_obs_metric, 103.0, 0);
    cr_assert_float_eq(obs->seen_obs_metric, 103.0, 0, "its own on_scalar too");
    tp_trainer_destroy(&tr);
    free(sync);
    free(obs);
}

Test(callback_actor, chief_only_observers_stay_off_other_ranks) {
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    tp_trainer_set_chief(tr, 0);
    s_rec_t *obs = s_rec_new();
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 1))), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 5);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(obs->log, "", "not on this rank: %s", obs->log);
    tp_trainer_destroy(&tr);
    free(obs);
}

/* ---- the actor's thread: started and stopped at named points --------------------- */

static int s_threads(void) {
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

typedef struct {
    int at_setup, at_before_train;
} s_count_t;
static tp_status_t cnt_setup_graph(void *impl, tp_trainer_t *tr) {
    ((s_count_t *)impl)->at_setup = s_threads();
    return TP_OK;
}
static tp_status_t cnt_before_train(void *impl, tp_trainer_t *tr) {
    ((s_count_t *)impl)->at_before_train = s_threads();
    return TP_OK;
}
static const tp_callback_ops_t s_count_ops = {
    .name = "ThreadCounter", .setup_graph = cnt_setup_graph, .before_train = cnt_before_train,
};

/* The thread starts after every setup_graph, before any before_train (not
 * at an observer's first message: this one has none before its epoch's
 * end), and training returns with it ended. */
Test(callback_actor, its_thread_runs_from_setup_to_the_end_of_training) {
    /* a first run starts what ZeroMQ keeps for the process (its I/O threads) */
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *obs = s_rec_new();
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    tp_schedule_t s = s_sched(1, 1, 2);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    tp_trainer_destroy(&tr);
    free(obs);
    /* its thread leaves right after its last message: wait until it has */
    int n0 = s_threads();
    for (int i = 0, n; i < 100; i++, n0 = n) {
        usleep(20000);
        if ((n = s_threads()) == n0)
            break;
    }
    tr = tp_trainer_new(&s_ops, &t);
    s_count_t count = {0};
    static const tp_callback_ops_t epoch_only = {.name = "EpochEnd", .after_epoch = rec_after_epoch};
    obs = s_rec_new();
    cr_assert_eq(s_add(tr, tp_callback_new(&s_count_ops, &count, 0)), TP_OK);
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&epoch_only, obs, 0))), TP_OK);
    cr_assert_eq(s_add(tr, tp_callback_new(&s_count_ops, &count, 0)), TP_OK);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(count.at_setup, n0, "not yet at setup_graph");
    cr_assert_eq(count.at_before_train, n0 + 1, "running at before_train");
    cr_assert_str_eq(obs->log, "after_epoch@1/2/2");
    /* ended (zactor's thread leaves right after its last message) */
    int n = s_threads();
    for (int i = 0; i < 100 && n != n0; i++) {
        usleep(10000);
        n = s_threads();
    }
    cr_assert_eq(n, n0, "the actor's thread ended with training");
    tp_trainer_destroy(&tr);
    free(obs);
}

/* After a signal, training ends 5 s later without an observer that does
 * not finish; the trainer's destroy then waits for its hook to return
 * (it used to leave the thread behind after 5 s more). */
Test(callback_actor, destroy_returns_once_a_stuck_observer_has_ended) {
    cr_assert_eq(tp_signals_install(), TP_OK);
    s_train_t t = {0};
    tp_trainer_t *tr = tp_trainer_new(&s_ops, &t);
    s_rec_t *obs = s_rec_new();
    obs->hang_at = 2;
    obs->raise_at_hang = 1;
    obs->hang_us = 10500000;  /* past the 5 s training waits and 5 s more */
    cr_assert_eq(s_add(tr, tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))), TP_OK);
    /* fewer events than the pipe holds: the trainer never waits to send
     * (a full pipe holds it until the hook returns, signal or not) */
    tp_schedule_t s = s_sched(1, 1, 200);
    cr_assert_eq(tp_trainer_train(tr, &s), TP_ERR_INTERRUPTED, "%s", tp_last_error());
    cr_assert_not(atomic_load(&obs->hang_done), "training did not wait for it");
    tp_trainer_destroy(&tr);
    cr_assert(atomic_load(&obs->hang_done), "destroy returned with the hook running");
    cr_assert_eq(obs->after_trains, 0, "what was queued behind it was skipped");
    tp_signal_clear();
    tp_signals_restore();
    free(obs);
}

/* ---- through launch_train_with_config, one and two towers ------------------- */

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *logits = tp_fc(t, "fc", in[0], 4, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}
static tp_optimizer_t *s_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.1, 0.9, 0);
}
static const tp_input_desc_t s_inputs[] = {{"x", TP_FLOAT32, 2, {-1, 2}},
                                           {"label", TP_INT32, 1, {-1}}};
static const tp_model_desc_t s_model = {s_inputs, 2, s_tower, s_opt, NULL};

Test(callback_actor, launched_training_gives_an_observer_the_same_hooks) {
    for (int towers = 1; towers <= 2; towers++) {
        char dir[] = "/tmp/tp-cbactor-XXXXXX";
        cr_assert_not_null(mkdtemp(dir));
        s_rec_t *sync = s_rec_new(), *obs = s_rec_new();
        sync->fetch = obs->fetch = "cost";
        tp_train_config_t c;
        tp_train_config_init(&c);
        c.model = &s_model;
        c.towers = towers;
        c.batch = 16;
        c.dataflow = tu_blobs(256, 4, 0.7f, 3, 16, 1, 0);
        c.max_epoch = 2;
        c.steps_per_epoch = 6;
        c.logdir = dir;
        c.threads = 1;
        c.save_checkpoints = 0;
        c.progress_names = "cost";
        tp_callback_t *cbs[2] = {tp_callback_new(&s_rec_ops, sync, 0),
                                 tp_cb_observe(tp_callback_new(&s_rec_ops, obs, 0))};
        c.callbacks = cbs;
        c.ncallbacks = 2;
        cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
        /* the same hooks, counters and fetched costs, but for the one
         * before_run at setup */
        const char *sp = strchr(sync->log, ' ');
        cr_assert_not_null(sp);
        int head = (int)(sp - sync->log);
        char expect[sizeof sync->log + 64];
        /* expect = "setup_graph@E/L/G before_run@E/L/G ..." */
        snprintf(expect, sizeof expect, "%.*s before_run%.*s%s", head, sync->log,
                 (int)(sp - strchr(sync->log, '@')), strchr(sync->log, '@'), sp);
        cr_assert_str_eq(obs->log, expect, "%d tower(s)", towers);
        cr_assert(strstr(sync->log, "after_epoch@2/6/12 trigger_epoch@2/6/12 after_train@2/6/12"),
                  "%s", sync->log);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
        free(sync);
        free(obs);
    }
}
