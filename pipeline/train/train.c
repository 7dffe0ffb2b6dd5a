/* towerpack pipeline/train: the
 * single-cost model trainers (simple, replicated, parameter server) and
 * launch_train_with_config with auto-resume. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/actor.h>
#include <towerpack/checkpoint.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/clock.h>
#include <towerpack/device.h>
#include <towerpack/stats.h>
#include <towerpack/supervisor.h>
#include <towerpack/launch.h>
#include "pipeline/callback_actor.h"
#include "pipeline/train/gan_step.h"
#include "pipeline/train/towers.h"
#include "pipeline/trainer_internal.h"

#define MAX_TOWERS 64
#define MAX_INPUTS 16

/* ---- the model trainer --------------------------------------------------------- */

typedef struct {
    tp_model_t *model;
    tp_input_t *input;
    tp_towers_t *executors;   /* one actor per tower */
    tp_trainer_kind_t kind;
    int towers;
    int64_t batch;
    double watchdog_s;
    const tp_train_dist_t *dist;   /* NULL: one process */
    /* Counted on the supervisor's thread (the one that runs the schedule),
     * read there by the statistics callback: batches taken, time spent
     * waiting for them and for the tower actors, and the one tower's
     * counters when it runs on this thread (no executors). */
    uint64_t taken, input_wait_ns, towers_wait_ns;
    uint64_t input_wait_t0;   /* the wait for input in progress (0: none) */
    tp_tower_meter_t meter0;
    tp_supervisor_t *sup;     /* the run's supervisor (see below) */
    size_t nactors;           /* its children: the run's own actors */
    tp_trainer_t *trainer;    /* set by setup */
    tp_datapoint_t *first[MAX_TOWERS]; /* each tower's first batch, taken at
                                          launch to check it, given to the
                                          first step */
    int fetch_checked;        /* the fetch names nobody gives were warned of */
    tp_gan_step_t *gan;       /* a GAN's step (cfg.gan), or NULL */
    double t_start;           /* the schedule's start (setup) */
    /* issue 47: the ranks' all-reduce of each step, on this thread: its
     * own row, and waiting time for the supervisor's */
    uint64_t allreduce_ns, allreduces;
} s_mt_t;

static tp_status_t s_supervise(s_mt_t *mt);
static int s_supervise_waiting(void *arg);

/* The schedule's clock starts, and the supervision rows know the trainer. */
static tp_status_t mt_setup(void *impl, tp_trainer_t *tr) {
    s_mt_t *t = impl;
    t->t_start = tp_now_s();
    t->trainer = tr;
    return TP_OK;
}

/* One step: every tower takes its own batch from the input (on this
 * thread, in tower order, so the data order is deterministic), the tower
 * actors compute in parallel (replicated: they all-reduce the gradients
 * among themselves), then the update is applied once. */
static tp_status_t s_step(s_mt_t *t, tp_trainer_t *tr, tp_fetches_t *f) {
    tp_datapoint_t *batches[MAX_TOWERS] = {NULL};
    /* Two clock reads a step: the supervisor's wait for input, whatever the
     * input is (its own counters are its business, see tp_input_stats). */
    uint64_t w0 = tp_now_ns();
    t->input_wait_t0 = w0;  /* the rows, published from inside the wait, count it */
    for (int i = 0; i < t->towers; i++) {
        if (t->first[i]) {  /* checked at launch */
            batches[i] = t->first[i];
            t->first[i] = NULL;
            continue;
        }
        tp_status_t rc = tp_input_next(t->input, i, &batches[i]);
        if (rc < 0) {
            for (int j = 0; j < i; j++)
                tp_input_release(t->input, j, &batches[j]);
            t->input_wait_t0 = 0;
            t->input_wait_ns += tp_now_ns() - w0;
            /* a wait ended by the tree's failure: the supervisor's message
             * (which child, how), not the wait's */
            if (s_supervise(t) == TP_ERR_PEER)
                return TP_ERR_PEER;
            return tp_error_wrap(rc, "tower%d input", i);
        }
    }
    uint64_t waited = tp_now_ns() - w0;
    t->input_wait_t0 = 0;
    t->input_wait_ns += waited;
    t->taken += (uint64_t)t->towers;
    if (t->gan) {  /* a GAN's updates, every tower from this thread (gan_step.h) */
        tp_status_t rc = tp_gan_step_run(t->gan, batches, tp_trainer_global_step(tr), f);
        for (int i = 0; i < t->towers; i++)
            tp_input_release(t->input, i, &batches[i]);
        TP_TRY(rc);
        tp_fetches_set(f, "trainer/input_wait_s", (double)waited * 1e-9);
        tp_clear_error();
        return TP_OK;
    }
    if (t->executors) {
        /* The towers compute, the supervisor waits: blocked on them (its
         * wait runs supervision: statistics while a long step runs). */
        uint64_t s0 = tp_now_ns();
        tp_status_t rc = tp_towers_step(t->executors, batches, t->watchdog_s);
        t->towers_wait_ns += tp_now_ns() - s0;
        TP_TRY(rc);
    } else {
        /* One tower runs on this thread. As an actor it cost 4-20% of the
         * engine's step rate on a 2-core host (tp-bench engine: 0.79-0.96
         * of a bare loop against 0.94-1.0 inline, docs/performance.md): the
         * supervisor's wake-up after each step is on the critical path.
         * With nothing to all-reduce the whole step is one run that updates
         * each variable as soon as its gradient is final, while it is still
         * in cache (the call a bare loop makes). Distributed, one tower per
         * rank: its update waits for the ranks' mean. */
        tp_status_t rc = tp_tower_compute(t->model, TP_ALL_TOWERS,
                                          t->dist ? TP_RUN_GRADIENTS : TP_RUN_TRAIN,
                                          batches[0], &t->meter0);
        tp_input_release(t->input, 0, &batches[0]);
        TP_TRY(rc);
    }
    if (t->executors || t->dist) {
        /* What the towers left: a replicated step whose slices they applied
         * is closed by the update run; otherwise it reduces onto tower 0
         * (parameter server) or takes the ranks' mean, then applies. */
        tp_run_opts_t o = {.stages = TP_RUN_UPDATE};
        if (t->kind == TP_TRAINER_PARAMETER_SERVER) {
            tp_run_opts_t r = {.stages = TP_RUN_REDUCE};
            TP_TRY(tp_model_run(t->model, TP_ALL_TOWERS, NULL, 0, NULL, 0, &r));
        }
        if (t->dist) {  /* data-parallel over processes: the ranks' mean */
            uint64_t a0 = tp_now_ns();
            tp_status_t rc = t->dist->allreduce_grads(t->dist->ctx, t->model,
                                                      tp_trainer_global_step(tr));
            t->allreduce_ns += tp_now_ns() - a0;
            t->allreduces++;
            TP_TRY(rc);
        }
        TP_TRY(tp_model_run(t->model, TP_ALL_TOWERS, NULL, 0, NULL, 0, &o));
    }
    /* Fetched scalars: the mean over the towers. */
    for (int k = 0; k < tp_fetches_count(f); k++) {
        const char *name = tp_fetches_name(f, k);
        double mean;
        if (tp_model_fetch_mean(t->model, t->towers, name, &mean))
            tp_fetches_set(f, name, mean);
        else if (!t->fetch_checked && strncmp(name, "trainer/", 8) != 0)
            /* once: a name a callback asks for (progress_names, a printer)
             * that no tower gives is otherwise silently absent */
            TP_WARN("fetch '%s' asked for by a callback: no tower gives it (the "
                    "model's outputs, metrics and \"cost\" are fetchable); it is "
                    "left out", name);
    }
    t->fetch_checked = 1;
    /* The step's own wait for its batches, for a callback that asks. */
    tp_fetches_set(f, "trainer/input_wait_s", (double)waited * 1e-9);
    tp_clear_error();
    return TP_OK;
}

/* The schedule's step, in its phases: supervision at the step boundary,
 * before the step changes anything (a child failed beyond its policy ends
 * training here; a signal is the trainer's to act on, at its own check of
 * the boundary), then the step, whose waits (for its batches, for its
 * towers) run supervision at every tick. */
static tp_status_t mt_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_mt_t *t = impl;
    tp_status_t rc = s_supervise(t);
    if (rc < 0 && rc != TP_ERR_INTERRUPTED)
        return rc;
    const tp_wait_phase_t waiting = {s_supervise_waiting, t};
    const tp_wait_phase_t *outer = tp_actor_wait_begin(&waiting);
    rc = s_step(t, tr, f);
    tp_actor_wait_end(outer);
    return rc;
}

static tp_status_t mt_set_hp(void *impl, const char *name, double v) {
    s_mt_t *t = impl;
    return t->gan ? tp_gan_step_set_hparam(t->gan, name, v)
                  : tp_model_set_hparam(t->model, name, v);
}
static tp_status_t mt_get_hp(void *impl, const char *name, double *v) {
    s_mt_t *t = impl;
    return t->gan ? tp_gan_step_get_hparam(t->gan, name, v)
                  : tp_model_get_hparam(t->model, name, v);
}
static int64_t mt_samples(void *impl) {
    s_mt_t *t = impl;
    return t->batch * t->towers * (t->dist ? t->dist->size : 1);
}
static tp_model_t *mt_model(void *impl) { return ((s_mt_t *)impl)->model; }

static void mt_destroy(void *impl) {
    s_mt_t *t = impl;
    /* its children first (upstream of the input); members are not its */
    tp_supervisor_destroy(&t->sup);
    tp_towers_destroy(&t->executors);
    for (int i = 0; i < MAX_TOWERS; i++)
        if (t->first[i])
            tp_input_release(t->input, i, &t->first[i]);
    tp_gan_step_destroy(&t->gan);
    tp_input_destroy(&t->input);
    tp_model_destroy(&t->model);
    free(t);
}

/* One model trainer under tensorpack's five names: the step, the schedule
 * and the supervision are the same (s_mt_t's kind and gan choose what
 * differs inside the step); the name is what its errors and logs say. */
#define S_MT_OPS(NAME)                                                         \
    {.name = (NAME), .setup = mt_setup, .run_step = mt_run_step,               \
     .set_hyperparam = mt_set_hp, .get_hyperparam = mt_get_hp,                 \
     .samples_per_step = mt_samples, .model = mt_model, .destroy = mt_destroy}

static const tp_trainer_ops_t s_kind_ops[] = {
    [TP_TRAINER_SIMPLE] = S_MT_OPS("SimpleTrainer"),
    [TP_TRAINER_REPLICATED] = S_MT_OPS("SyncMultiGPUTrainerReplicated"),
    [TP_TRAINER_PARAMETER_SERVER] = S_MT_OPS("SyncMultiGPUTrainerParameterServer"),
};
static const tp_trainer_ops_t s_gan_ops = S_MT_OPS("GANTrainer");
static const tp_trainer_ops_t s_separate_gan_ops = S_MT_OPS("SeparateGANTrainer");

/* ---- the supervision of a run -----------------------------------------------------
 * Training runs under a supervisor (actors/supervisor.c, the same one that
 * runs a user's actor tree). Its children are the run's own actors
 * (cfg.actors), started, watched (ends, errors, heartbeats) and restarted
 * under their policies. Its members are the parts of the tree that keep
 * their own protocol, in the order the data flows:
 *  - the input: the rows it gives about itself (tp_input_stats: QueueInput's
 *    prefetch actor and forked workers, StagingInput's stages, ZMQInput's
 *    receiver, a custom input's own);
 *  - the schedule: the "supervisor" row, the thread that runs the epochs and
 *    the synchronous hooks (busy is time in those hooks, starved waiting for
 *    batches, blocked waiting for the tower actors);
 *  - the towers, with the rows they count themselves;
 *  - the callback actor, where the observing callbacks run.
 * Supervision is a phase of the step (mt_run_step calls s_supervise by
 * name): a watch round (tp_supervisor_tick) at every step boundary, and at
 * every tick of the step's waits (every 100 ms while the schedule waits for
 * a batch or for its towers: the step makes s_supervise_waiting the
 * thread's wait phase, and the waits call tp_actor_wait_tick): restarts,
 * failures, signals, and once a second every row on the stats socket that
 * tp-top reads. After each epoch RunStatistics puts the input's scalars,
 * the time the schedule waited for input and the children's restarts into
 * stats.json. Nothing here knows what kind of input it has. */

static int s_rows_input(void *impl, tp_stats_row_t *rows, int max) {
    return tp_input_stats(((s_mt_t *)impl)->input, rows, max);
}

static int s_rows_schedule(void *impl, tp_stats_row_t *rows, int max) {
    s_mt_t *mt = impl;
    if (max < 1 || mt->t_start <= 0)
        return 0;
    tp_stats_row_t *tr = &rows[0];
    memset(tr, 0, sizeof *tr);
    snprintf(tr->name, sizeof tr->name, "supervisor");
    tr->state = TP_ACTOR_RUNNING;
    tr->msgs_in = mt->taken;
    /* a wait for input in progress is starved time too: a stalled input
     * must not make the schedule look busy */
    uint64_t waiting = mt->input_wait_t0 ? tp_now_ns() - mt->input_wait_t0 : 0;
    tr->starved_s = (double)(mt->input_wait_ns + waiting) * 1e-9;
    /* waiting for tower actors, and for the other ranks in the all-reduce
     * (its own row's busy time: the bottleneck mark may land there) */
    tr->blocked_s = (double)(mt->towers_wait_ns + mt->allreduce_ns) * 1e-9;
    double alive = tp_now_s() - mt->t_start;
    double idle = tr->starved_s + tr->blocked_s;
    tr->busy_s = alive > idle ? alive - idle : 0;
    tr->alive_s = alive;
    tr->queue_fill = -1;  /* the input's rows show their queues */
    return 1;
}

static int s_rows_towers(void *impl, tp_stats_row_t *rows, int max) {
    s_mt_t *mt = impl;
    if (mt->executors)
        return tp_towers_stats(mt->executors, rows, max);
    if (max < 1)
        return 0;
    tp_tower_meter_row(&mt->meter0, 0, &rows[0]);
    return 1;
}

/* Under MPI, the all-reduce of the ranks' gradients: busy for as long as
 * a step waits in it (the slowest rank's compute and the transfer). */
static int s_rows_allreduce(void *impl, tp_stats_row_t *rows, int max) {
    s_mt_t *mt = impl;
    if (!mt->dist || max < 1 || mt->t_start <= 0)
        return 0;
    tp_stats_row_t *r = &rows[0];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "all-reduce (%d ranks)", mt->dist->size);
    r->state = TP_ACTOR_RUNNING;
    r->msgs_in = r->msgs_out = mt->allreduces;
    r->busy_s = (double)mt->allreduce_ns * 1e-9;
    r->alive_s = tp_now_s() - mt->t_start;
    r->queue_fill = -1;
    return 1;
}

static int s_rows_callbacks(void *impl, tp_stats_row_t *rows, int max) {
    s_mt_t *mt = impl;
    tp_cb_actor_t *cba = mt->trainer ? tp_cb_actor_of(mt->trainer) : NULL;
    if (!cba || max < 1)
        return 0;
    tp_cb_actor_row(cba, &rows[0]);
    return 1;
}

static const tp_supervised_ops_t s_members[] = {
    {"input", s_rows_input, NULL},
    {"schedule", s_rows_schedule, NULL},
    {"towers", s_rows_towers, NULL},
    {"allreduce", s_rows_allreduce, NULL},
    {"callbacks", s_rows_callbacks, NULL},
};

/* The run's supervisor, its members added and its children started. Made
 * after the input has started (its forked workers never see the threads
 * and sockets made here). NULL with tp_last_error() set. */
static tp_supervisor_t *s_supervisor_new(s_mt_t *mt, const tp_train_config_t *cfg) {
    tp_supervisor_opts_t o;
    tp_supervisor_opts_init(&o);
    o.name = "tp-train";  /* the stats source tp-top shows */
    o.run_dir = cfg->logdir;
    o.stats = cfg->logdir || cfg->stats ? cfg->stats : "off";
    char source[64];
    if (cfg->dist) {
        /* tp-top merges the ranks' snapshots by this name (docs/distributed.md) */
        snprintf(source, sizeof source, "tp-train/r%d", cfg->dist->rank);
        o.name = source;
        /* another rank's socket beside rank 0's (tp-train), in a directory
         * that is on rank 0's host only: none on the other hosts */
        const char *slash = cfg->dist->rank > 0 && cfg->stats &&
                                    !strncmp(cfg->stats, "ipc://", 6)
                                ? strrchr(cfg->stats, '/') : NULL;
        char dir[4096];
        if (slash && (size_t)(slash - cfg->stats - 6) < sizeof dir) {
            memcpy(dir, cfg->stats + 6, (size_t)(slash - cfg->stats - 6));
            dir[slash - cfg->stats - 6] = '\0';
            if (dir[0] && access(dir, F_OK) != 0) {
                TP_INFO("rank %d: no statistics socket (%s is not on this host; tp-train "
                        "--stats 'tcp://HOST:{PORT+rank}' gives every rank one)",
                        cfg->dist->rank, dir);
                o.stats = "off";
            }
        }
    }
    tp_supervisor_t *sup = tp_supervisor_new(&o);
    if (!sup) {
        tp_error_wrap(TP_ERR_IO, "the training's supervisor");
        return NULL;
    }
    tp_status_t rc = TP_OK;
    for (size_t i = 0; rc >= 0 && i < sizeof s_members / sizeof *s_members; i++)
        rc = tp_supervisor_add_member(sup, &s_members[i], mt);
    for (size_t i = 0; rc >= 0 && i < cfg->nactors; i++)
        rc = tp_supervisor_add(sup, cfg->actors[i].def, cfg->actors[i].arg,
                               &cfg->actors[i].policy);
    if (rc >= 0)
        rc = tp_supervisor_start(sup);
    if (rc < 0) {
        tp_supervisor_destroy(&sup);
        return NULL;
    }
    if (*tp_supervisor_stats_endpoint(sup))
        TP_INFO("statistics for tp-top at %s", tp_supervisor_stats_endpoint(sup));
    return sup;
}

/* The supervision phase: one watch round of the run's supervisor;
 * tp_supervisor_tick's status (TP_ERR_INTERRUPTED after a signal,
 * TP_ERR_PEER once a child failed beyond its policy). */
static tp_status_t s_supervise(s_mt_t *mt) {
    return mt->sup ? tp_supervisor_tick(mt->sup) : TP_OK;
}

/* The step's wait phase (tp_actor_wait_tick, every 100 ms): supervision,
 * so that a child feeding the input that dies while the step waits is
 * restarted then; a failure beyond its policy ends a wait for batches (the
 * towers' wait finishes the step, and the next boundary reports it). */
static int s_supervise_waiting(void *arg) {
    return s_supervise(arg) == TP_ERR_PEER;
}

/* What an epoch adds to stats.json about the run: the input's scalars, the
 * schedule's wait for input, the device's share, the children's restarts,
 * the steps the latest-only observers skipped. A callback because
 * after_epoch is where an epoch's scalars go (stamped with its last step);
 * it only reads counters. */
static tp_status_t rs_after_epoch(void *impl, tp_trainer_t *tr) {
    s_mt_t *mt = impl;
    tp_input_scalar_t v[160];  /* with 64 forked workers' memory */
    int n = tp_input_scalars(mt->input, v, 160);
    for (int i = 0; i < n; i++)
        tp_trainer_put_scalar(tr, v[i].name, v[i].value);
    tp_trainer_put_scalar(tr, "trainer/input_wait_s",
                          (double)mt->input_wait_ns * 1e-9);
    if (tp_backend_device(tp_model_backend(mt->model)) >= 0)  /* the GPU's share */
        tp_trainer_put_scalar(tr, "trainer/device_wait_s",
                              (double)tp_model_device_wait_ns(mt->model) * 1e-9);
    if (mt->nactors)
        tp_trainer_put_scalar(tr, "supervisor/restarts",
                              (double)tp_supervisor_restarts_total(mt->sup));
    tp_cb_actor_t *cba = tp_cb_actor_of(tr);
    if (cba)  /* steps the latest-only observers skipped: they were behind */
        tp_trainer_put_scalar(tr, "callbacks/skipped_steps", (double)tp_cb_actor_skipped(cba));
    return TP_OK;
}

static const tp_callback_ops_t s_run_statistics_ops = {
    .name = "RunStatistics",
    .after_epoch = rs_after_epoch,
};

/* ---- TrainConfig ------------------------------------------------------------------ */

void tp_train_config_init(tp_train_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->trainer = (tp_trainer_kind_t)-1;
    cfg->towers = 1;
    cfg->batch = 32;
    cfg->seed = 1;
    cfg->default_callbacks = 1;
    cfg->progress_names = "cost";
    cfg->tensorboard = 1;
    cfg->curves = 1;
    cfg->plots = 1;
    cfg->log_every_n_steps = 50;
    cfg->save_checkpoints = 1;
    cfg->starting_epoch = 1;
    cfg->watchdog_s = 10;
    cfg->device = -1;
    cfg->tf32 = -1;
    cfg->bf16 = -1;
}

void tp_train_config_fini(tp_train_config_t *cfg) {
    tp_dataflow_destroy(&cfg->dataflow);
    tp_dataflow_destroy(&cfg->validation);
    tp_input_destroy(&cfg->input);
    for (size_t i = 0; i < cfg->ncallbacks; i++)
        tp_callback_destroy(&cfg->callbacks[i]);
    for (size_t i = 0; i < cfg->nmonitors; i++)
        tp_callback_destroy(&cfg->monitors[i]);
    cfg->ncallbacks = cfg->nmonitors = 0;
}

static tp_status_t s_add(tp_trainer_t *tr, tp_callback_t *cb) {
    return tp_trainer_add_callback(tr, &cb);
}

/* The checkpoint a resume starts from: ckpt (the latest) when it verifies
 * (checksums, finite values, a trainer state that fits the schedule), else
 * the newest older one of logdir that does, said with the file that failed
 * and why; ckpt[size] is replaced by it. None verifies: an error (never a
 * silent start from scratch over damaged checkpoints). *epoch, *step: the
 * epoch and global step it was taken at. */
static tp_status_t s_ckpt_state(char *ckpt, size_t size, const char *logdir,
                                int64_t steps_per_epoch, int64_t *epoch, int64_t *step) {
    char why[1024] = "";
    for (int tries = 0;; tries++) {
        tp_train_state_t st;
        if (tp_checkpoint_verify(ckpt, steps_per_epoch, &st) == TP_OK) {
            if (tries)
                TP_WARN("resume: falling back to %s, the newest checkpoint that verifies "
                        "(%d newer one%s failed; the newest: %s)", ckpt, tries,
                        tries > 1 ? "s" : "", why);
            *epoch = st.epoch;
            *step = st.global_step;
            return TP_OK;
        }
        if (!tries)
            snprintf(why, sizeof why, "%s", tp_last_error());
        TP_WARN("resume: %s", tp_last_error());  /* names the file */
        char older[4096];
        if (tp_checkpoint_find_older(logdir, ckpt, older, sizeof older) < 0)
            return tp_error(TP_ERR_FORMAT, "resume: no checkpoint in %s verifies (the "
                            "newest: %s)", logdir, why);
        snprintf(ckpt, size, "%s", older);
    }
}

/* A ModelSaver, also inside a wrapper (PeriodicTrigger(ModelSaver)). */
static int s_is_model_saver(tp_callback_t *cb) {
    return strcmp(tp_callback_name(tp_cb_unwrap(cb)), "ModelSaver") == 0;
}

/* The TrainConfig's rules, checked before anything is made: the first
 * broken one, named with its value. */
static tp_status_t s_check_config(const tp_train_config_t *cfg) {
    if (!cfg->model)
        return tp_error(TP_ERR_INVALID, "TrainConfig.model is NULL: training needs a "
                        "model description (tp_model_desc_t)");
    if (!cfg->model->build)
        return tp_error(TP_ERR_INVALID, "TrainConfig.model: tp_model_desc_t.build is "
                        "NULL: the tower function that declares the model is required");
    if (!cfg->model->optimizer)
        return tp_error(TP_ERR_INVALID, "TrainConfig.model: tp_model_desc_t.optimizer "
                        "is NULL: training needs an optimizer (a model without one is "
                        "inference-only: see predict.h)");
    if (cfg->model->ninputs < 0 || cfg->model->ninputs > MAX_INPUTS)
        return tp_error(TP_ERR_INVALID, "TrainConfig.model: tp_model_desc_t.ninputs "
                        "is %d: at most %d inputs", cfg->model->ninputs, MAX_INPUTS);
    if (!cfg->dataflow && !cfg->input)
        return tp_error(TP_ERR_INVALID, "TrainConfig: no dataflow and no input: set "
                        ".dataflow (the batches to train on) or .input");
    if (cfg->max_epoch < 1)
        return tp_error(TP_ERR_INVALID, "TrainConfig.max_epoch: need max_epoch >= 1 "
                        "(got %lld)", (long long)cfg->max_epoch);
    if (cfg->towers < 1 || cfg->towers > MAX_TOWERS)
        return tp_error(TP_ERR_INVALID, "TrainConfig.towers: need 1..%d towers (got %d)",
                        MAX_TOWERS, cfg->towers);
    /* negative: the launch picks (by the towers); past the last kind there is
     * no trainer (and no table in s_kind_ops) */
    if ((int)cfg->trainer > TP_TRAINER_PARAMETER_SERVER)
        return tp_error(TP_ERR_INVALID, "TrainConfig.trainer: %d is no trainer kind (0 "
                        "SIMPLE, 1 REPLICATED, 2 PARAMETER_SERVER; -1: by the towers)",
                        (int)cfg->trainer);
    if (cfg->batch < 1)
        return tp_error(TP_ERR_INVALID, "TrainConfig.batch: need batch >= 1 (got %lld)",
                        (long long)cfg->batch);
    if (cfg->steps_per_epoch < 0)
        return tp_error(TP_ERR_INVALID, "TrainConfig.steps_per_epoch: need >= 0 "
                        "(0: the input's size) (got %lld)", (long long)cfg->steps_per_epoch);
    if (cfg->log_every_n_steps < 0)
        return tp_error(TP_ERR_INVALID, "TrainConfig.log_every_n_steps: need >= 0 (0: "
                        "once an epoch only) (got %lld)", (long long)cfg->log_every_n_steps);
    /* Two ModelSavers would write the same LOGDIR/model-STEP.safetensors
     * through the same temporary file and delete each other's checkpoints
     * (issue 46). One of the user's own makes the default one step aside
     * (the launch below); two of the user's are refused. */
    int savers = 0;
    for (size_t i = 0; i < cfg->ncallbacks; i++)
        savers += cfg->callbacks[i] && s_is_model_saver(cfg->callbacks[i]);
    for (size_t i = 0; i < cfg->nmonitors; i++)
        savers += cfg->monitors[i] && s_is_model_saver(cfg->monitors[i]);
    if (savers > 1)
        return tp_error(TP_ERR_INVALID, "TrainConfig.callbacks: %d ModelSavers: they "
                        "would write the same model-STEP.safetensors files in the log "
                        "directory and delete each other's; keep one (MinSaver and "
                        "MaxSaver write files of their own)", savers);
    return TP_OK;
}

/* The first batch of every tower against the model's inputs (count, dtype,
 * rank, the non-batch dims the description fixes): a mismatch is said at
 * launch, naming the input, before any callback has written a file. The
 * batches are kept for the first step (mt->first). Input `fed` (-1: none)
 * is fed by the trainer, not the dataflow (a GAN's noise): the components
 * are the other inputs, in order. */
static tp_status_t s_check_first_batches(s_mt_t *mt, const tp_model_desc_t *d,
                                         int fed) {
    const int want = d->ninputs - (fed >= 0 && fed < d->ninputs);
    for (int i = 0; i < mt->towers; i++) {
        tp_status_t rc = tp_input_next(mt->input, i, &mt->first[i]);
        if (rc < 0) { /* the input named once: the built-in ones name themselves */
            const char *name = tp_input_name(mt->input);
            if (strstr(tp_last_error(), name))
                return tp_error_wrap(rc, "the first batch of tower %d", i);
            return tp_error_wrap(rc, "the first batch of tower %d from %s", i, name);
        }
        int nc = tp_datapoint_size(mt->first[i]);
        if (nc != want) {
            char names[512] = "";
            for (int k = 0, j = 0; k < d->ninputs; k++)
                if (k != fed)
                    snprintf(names + strlen(names), sizeof names - strlen(names),
                             "%s%s", j++ ? ", " : "", d->inputs[k].name);
            if (want < d->ninputs)
                return tp_error(TP_ERR_SHAPE, "the dataflow's first datapoint has %d "
                                "component%s, the model takes %d from it (%s; the "
                                "trainer feeds '%s')", nc, nc == 1 ? "" : "s", want,
                                names, d->inputs[fed].name);
            return tp_error(TP_ERR_SHAPE, "the dataflow's first datapoint has %d "
                            "component%s, the model has %d inputs (%s)", nc,
                            nc == 1 ? "" : "s", d->ninputs, names);
        }
        tp_tensor_t v[MAX_INPUTS];
        tp_datapoint_views(mt->first[i], v, nc);
        for (int k = 0; k < nc; k++) {
            const int ik = fed >= 0 && k >= fed ? k + 1 : k;  /* the model's input */
            const tp_input_desc_t *in = &d->inputs[ik];
            int bad = v[k].dtype != in->dtype || v[k].ndim != in->ndim;
            for (int a = 1; !bad && a < in->ndim; a++)
                bad = in->shape[a] >= 0 && v[k].shape[a] != in->shape[a];
            if (!bad)
                continue;
            char shape[128] = "", got[128] = "";
            for (int a = 0; a < in->ndim; a++) {
                size_t w = strlen(shape);
                if (in->shape[a] < 0)
                    snprintf(shape + w, sizeof shape - w, "%s?", a ? "," : "");
                else
                    snprintf(shape + w, sizeof shape - w, "%s%lld", a ? "," : "",
                             (long long)in->shape[a]);
            }
            for (int a = 0; a < v[k].ndim; a++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
                         a ? "," : "", (long long)v[k].shape[a]);
            return tp_error(TP_ERR_SHAPE, "input '%s' (input %d): the model takes %s "
                            "[%s], the dataflow's first datapoint gives %s [%s]",
                            in->name, ik, tp_dtype_name(in->dtype), shape,
                            tp_dtype_name(v[k].dtype), got);
        }
    }
    return TP_OK;
}

tp_status_t tp_launch_train_with_config(tp_train_config_t *cfg,
                                        tp_model_t **out_model) {
    tp_status_t rc = TP_OK;
    tp_trainer_t *tr = NULL;
    /* the log directory: locked for the run; the one used (another with
     * TP_LOGDIR_NEW) is cfg->logdir until the launch returns */
    tp_logdir_lock_t *dirlock = NULL;
    const char *user_logdir = cfg->logdir;
    char logdir[4096];
    if (out_model)
        *out_model = NULL;
    /* Everything that can be said about the config is said here, before
     * the log directory is made: one rule a message, with its value. */
    if ((rc = s_check_config(cfg)) < 0) {
        TP_ERROR("%s", tp_last_error());
        tp_train_config_fini(cfg);
        return rc;
    }
    int own_saver = 0;  /* one of the user's callbacks is a ModelSaver */
    for (size_t i = 0; i < cfg->ncallbacks; i++)
        own_saver |= cfg->callbacks[i] && s_is_model_saver(cfg->callbacks[i]);
    for (size_t i = 0; i < cfg->nmonitors; i++)
        own_saver |= cfg->monitors[i] && s_is_model_saver(cfg->monitors[i]);
    /* A directory this launch makes is removed again when the launch fails
     * before training starts: a mistake leaves no trace on disk. */
    struct stat dst;
    const int dir_existed = cfg->logdir && stat(cfg->logdir, &dst) == 0;
    int training = 0;
    tp_trainer_kind_t kind = cfg->trainer;
    if ((int)kind < 0)
        kind = cfg->towers == 1 ? TP_TRAINER_SIMPLE : TP_TRAINER_REPLICATED;
    if (cfg->ndevices > 1 &&
        (cfg->ndevices > TP_MODEL_DEVICES_MAX || cfg->towers != cfg->ndevices ||
         kind != TP_TRAINER_REPLICATED || cfg->dist)) {
        rc = tp_error(TP_ERR_INVALID, "TrainConfig: towers on %d GPUs (at most "
                      "%d) take one tower each (got %d towers), the replicated "
                      "trainer, and no distributed run", cfg->ndevices,
                      TP_MODEL_DEVICES_MAX, cfg->towers);
        TP_ERROR("%s", tp_last_error());
        tp_train_config_fini(cfg);
        return rc;
    }

    if (cfg->gan && (cfg->ndevices > 1 || cfg->dist)) {
        rc = tp_error(TP_ERR_UNSUPPORTED, "TrainConfig: a GAN's towers run from one "
                      "thread on one device (not on %d GPUs, not distributed)",
                      cfg->ndevices);
        tp_train_config_fini(cfg);
        return rc;
    }

    s_mt_t *mt = calloc(1, sizeof *mt);
    if (!mt) {
        tp_train_config_fini(cfg);
        return tp_error(TP_ERR_NOMEM, "trainer");
    }
    /* tensorpack's defaults: a dataflow gets QueueInput, and with more than
     * one tower, or towers on a GPU, StagingInput on top (each tower's next
     * batch staged in its memory while it computes; on a GPU copied from
     * pinned memory on a copy stream, bound below). */
    mt->input = cfg->input ? cfg->input : tp_input_queue(cfg->dataflow, 50);
    if (!cfg->input && (cfg->towers > 1 || cfg->device >= 0 || cfg->ndevices > 1) &&
        mt->input)
        mt->input = tp_input_staging(mt->input, 1, NULL);
    cfg->input = NULL;
    cfg->dataflow = NULL;
    mt->kind = kind;
    mt->watchdog_s = cfg->watchdog_s > 0 ? cfg->watchdog_s : 0;
    tp_input_set_watchdog(mt->input, mt->watchdog_s);
    mt->towers = cfg->towers;
    mt->batch = cfg->batch;
    mt->dist = cfg->dist;
    tr = tp_trainer_new(cfg->gan ? (cfg->gan->d_period > 0 ? &s_separate_gan_ops : &s_gan_ops)
                                 : &s_kind_ops[kind], mt);
    if (!tr)
        mt = NULL;  /* tp_trainer_new destroyed it */
    if (!tr || !mt->input) {
        rc = tp_error(TP_ERR_NOMEM, "trainer");
        goto out;
    }
    tp_trainer_set_watchdog(tr, mt->watchdog_s);  /* observers stuck in a hook */

    /* Where training starts: a resumed run continues after its latest
     * checkpoint. Read before anything starts a thread: the input may fork
     * dataflow workers. */
    tp_schedule_t sched = {cfg->starting_epoch, cfg->max_epoch, cfg->steps_per_epoch};
    int64_t resume_step = -1;
    char ckpt[4096] = "";
    if (cfg->logdir) {
        /* tp-train's --logdir-action, here too: a directory that holds a
         * run is refused unless the action says what to do with it (a
         * question on a terminal) or the run resumes it */
        tp_logdir_action_t action = cfg->logdir_action;
        if (action == TP_LOGDIR_ASK && cfg->auto_resume)
            action = TP_LOGDIR_KEEP;
        int fresh = tp_logdir_is_fresh(cfg->logdir);
        if ((rc = tp_logdir_prepare(cfg->logdir, action, logdir, sizeof logdir,
                                    &dirlock)) < 0)
            goto out;
        if (action == TP_LOGDIR_KEEP && !cfg->auto_resume && !fresh)
            TP_WARN("log directory %s is kept and this run does not resume it: its "
                    "checkpoints, statistics and event files stay beside the new "
                    "run's", logdir);
        cfg->logdir = logdir;
        tp_trainer_set_logdir(tr, cfg->logdir);
        if (cfg->auto_resume &&
            tp_checkpoint_find_latest(cfg->logdir, ckpt, sizeof ckpt) == TP_OK) {
            int64_t epoch = 0;
            if ((rc = s_ckpt_state(ckpt, sizeof ckpt, cfg->logdir, cfg->steps_per_epoch,
                                   &epoch, &resume_step)) < 0)
                goto out;
            sched.starting_epoch = epoch + 1;
            tp_trainer_set_global_step(tr, resume_step);
        } else if (cfg->auto_resume) {
            ckpt[0] = '\0';
            TP_WARN("no checkpoint in %s: starting from scratch", cfg->logdir);
        }
    }
    if (cfg->dist) {  /* rank 0 alone reads the log directory */
        tp_trainer_set_chief(tr, cfg->dist->rank == 0);
        if ((rc = cfg->dist->agree_start(cfg->dist->ctx, &resume_step,
                                         &sched.starting_epoch)) < 0)
            goto out;
        if (resume_step >= 0)
            tp_trainer_set_global_step(tr, resume_step);
    }
    /* Replay the input up to the checkpoint, so every later batch is the one
     * an unbroken run would see. */
    rc = tp_input_start(mt->input, cfg->towers, cfg->seed,
                        resume_step > 0 ? resume_step * cfg->towers : 0);
    if (rc < 0) {
        rc = tp_error_wrap(rc, "starting %s", tp_input_name(mt->input));
        goto out;
    }

    tp_model_config_t mc = tp_model_config_default();
    mc.towers = cfg->towers;
    mc.batch = cfg->batch;
    mc.infer_batch = cfg->infer_batch > 0 ? cfg->infer_batch
                   : cfg->validation ? cfg->batch : 0;
    mc.seed = cfg->seed;
    mc.threads = cfg->threads;
    if (cfg->device >= 0 || cfg->ndevices > 1) {
        /* here, after the input has started: its forked workers never
         * see CUDA loaded (distributed, the ranks' gradients are then
         * all-reduced on the GPUs: dist->sync_model joins them) */
        int n = cfg->ndevices > 1 ? cfg->ndevices : 1;
        for (int r = 0; r < n; r++) {
            tp_cuda_options_t co = tp_cuda_options_default();
            co.device = n > 1 ? cfg->devices[r] : cfg->device;
            if (cfg->tf32 >= 0)
                co.tf32 = cfg->tf32 != 0;
            if (cfg->bf16 >= 0)
                co.bf16 = cfg->bf16 != 0;
            if (!(mc.devices[r] = tp_backend_cuda_new(&co))) {
                rc = tp_error_wrap(TP_ERR_UNSUPPORTED, "towers on CUDA device %d",
                                   co.device);
                for (int q = 0; q < r; q++)
                    tp_backend_destroy(&mc.devices[q]);
                goto out;
            }
        }
        mc.ndevices = n;
        mc.own_backend = 1;  /* the model (also one handed out) keeps them */
    } else {
        /* the CPU's bf16 products (before the model plans its workspaces) */
        tp_backend_cpu_bf16_ask(cfg->bf16);
    }
    mt->model = tp_model_new(cfg->model, &mc);
    if (!mt->model) {
        rc = tp_error_wrap(TP_ERR_INVALID, "building the model");
        goto out;
    }
    if (cfg->model_name && (rc = tp_model_set_name(mt->model, cfg->model_name)) < 0)
        goto out;
    if (resume_step >= 0 && ckpt[0]) {
        tp_train_state_t st;
        rc = tp_checkpoint_load(mt->model, ckpt, TP_LOAD_STRICT, &st);
        if (rc < 0) {
            rc = tp_error_wrap(rc, "resuming from %s", ckpt);
            goto out;
        }
        TP_INFO("resuming from %s: epoch %lld done, global step %lld", ckpt,
                (long long)st.epoch, (long long)st.global_step);
    } else if (cfg->session_init) {
        rc = tp_checkpoint_load(mt->model, cfg->session_init, TP_LOAD_WEIGHTS_ONLY, NULL);
        if (rc < 0) {
            rc = tp_error_wrap(rc, "session_init %s", cfg->session_init);
            goto out;
        }
    }
    /* an input that makes its batches where the towers compute moves there */
    tp_backend_t *tower_backends[MAX_TOWERS];
    for (int i = 0; i < cfg->towers; i++)
        tower_backends[i] = tp_model_tower_backend(mt->model, i);
    if ((rc = tp_input_bind_towers(mt->input, tower_backends, cfg->towers)) < 0) {
        rc = tp_error_wrap(rc, "%s", tp_input_name(mt->input));
        goto out;
    }
    if (cfg->dist && (rc = cfg->dist->sync_model(cfg->dist->ctx, mt->model,
                                                 cfg->seed, resume_step)) < 0)
        goto out;
    tp_tower_meter_init(&mt->meter0);  /* the one tower, when it runs here */
    if (cfg->gan) {  /* the noise's rows per tower: TrainConfig's batch */
        tp_gan_config_t gc = *cfg->gan;
        gc.batch = cfg->batch;
        if (!(mt->gan = tp_gan_step_new(mt->model, &gc))) {
            rc = tp_error_wrap(TP_ERR_INVALID, "TrainConfig.gan");
            goto out;
        }
    }
    if (cfg->towers > 1 && !cfg->gan &&
        !(mt->executors = tp_towers_new(mt->model, cfg->towers,
                                        kind != TP_TRAINER_REPLICATED ? TP_RUN_GRADIENTS
                                        : cfg->dist ? TP_RUN_FORWARD | TP_RUN_BACKWARD |
                                                          TP_RUN_REDUCE
                                                    : TP_RUN_TRAIN,
                                        mt->input))) {
        rc = tp_error_wrap(TP_ERR_NOMEM, "tower executors");
        goto out;
    }
    if (sched.steps_per_epoch <= 0) {
        sched.steps_per_epoch = tp_input_size(mt->input);
        if (sched.steps_per_epoch <= 0) {
            rc = tp_error(TP_ERR_INVALID, "TrainConfig: steps_per_epoch is needed: "
                          "the input %s has no size", tp_input_name(mt->input));
            goto out;
        }
    }

    /* Callbacks in tensorpack's order. */
    /* The validation runner first: callbacks that read its results after
     * an epoch (MinSaver, MaxSaver, StatMonitorParamSetter) see this
     * epoch's numbers. */
    if (cfg->validation) {
        tp_inferencer_t infs[8];
        size_t n = 0;
        for (int i = 0; i < tp_model_metric_count(mt->model, -1) && n < 8; i++)
            infs[n++] = (tp_inferencer_t){TP_INFER_SCALAR_STATS,
                                          tp_model_metric_name(mt->model, -1, i), NULL};
        rc = s_add(tr, tp_cb_inference_runner(cfg->validation, infs, n));
        cfg->validation = NULL;
        if (rc < 0)
            goto out;
    }
    for (size_t i = 0; i < cfg->ncallbacks; i++) {
        tp_callback_t *cb = cfg->callbacks[i];
        cfg->callbacks[i] = NULL;  /* taken, also when adding it fails */
        if ((rc = s_add(tr, cb)) < 0)
            goto out;
    }
    /* the default ModelSaver steps aside for the user's own: two would
     * write the same files (issue 46; two of the user's are refused) */
    if (cfg->logdir && cfg->save_checkpoints && !own_saver &&
        (rc = s_add(tr, tp_cb_model_saver(10, 0))) < 0)
        goto out;
    if (!(mt->sup = s_supervisor_new(mt, cfg))) {
        rc = tp_error_wrap(TP_ERR_IO, "starting the training tree");
        goto out;
    }
    mt->nactors = cfg->nactors;
    /* Each tower's first batch against the model's inputs, before any
     * callback writes a file. After the supervisor has started the run's
     * actors (one may be what feeds the input), its wait supervised as a
     * step's is. */
    {
        const tp_wait_phase_t waiting = {s_supervise_waiting, mt};
        const tp_wait_phase_t *outer = tp_actor_wait_begin(&waiting);
        rc = s_check_first_batches(mt, cfg->model, cfg->gan ? cfg->gan->noise_input : -1);
        tp_actor_wait_end(outer);
        if (rc < 0)
            goto out;
    }
    if ((rc = s_add(tr, tp_callback_new(&s_run_statistics_ops, mt, 0))) < 0)
        goto out;
    if (cfg->default_callbacks) {
        /* the training curve every N steps: the progress names and the
         * towers' metrics */
        char stepnames[512];
        snprintf(stepnames, sizeof stepnames, "%s",
                 cfg->progress_names ? cfg->progress_names : "");
        for (int i = 0; i < tp_model_metric_count(mt->model, 0); i++) {
            const char *mn = tp_model_metric_name(mt->model, 0, i);
            size_t len = strlen(stepnames);
            char key[160], list[520];  /* ",name," in ",list," */
            snprintf(key, sizeof key, ",%s,", mn);
            snprintf(list, sizeof list, ",%s,", stepnames);
            if (!strstr(list, key))
                snprintf(stepnames + len, sizeof stepnames - len, "%s%s",
                         len ? "," : "", mn);
        }
        if (cfg->log_every_n_steps > 0 && *stepnames &&
            (rc = s_add(tr, tp_cb_step_scalars(stepnames, cfg->log_every_n_steps))) < 0)
            goto out;
        if ((rc = s_add(tr, tp_cb_epoch_mean(cfg->progress_names))) < 0 ||
            /* what only watches runs on the callback actor */
            (rc = s_add(tr, tp_cb_observe_latest(
                                tp_cb_progress_bar_tokens(cfg->progress_names, NULL,
                                                          cfg->tokens_per_sample),
                                0.1))) < 0 ||
            (rc = s_add(tr, tp_cb_throughput())) < 0 ||
            (rc = s_add(tr, tp_cb_observe(tp_cb_eta()))) < 0 ||
            (rc = s_add(tr, tp_cb_check_numerics(cfg->progress_names, 1))) < 0 ||
            (rc = s_add(tr, tp_cb_slow_callback_report(1.0))) < 0 ||
            (rc = s_add(tr, tp_cb_peak_memory())) < 0 ||
            (rc = s_add(tr, tp_cb_gpu_utilization())) < 0)
            goto out;
        if (cfg->logdir && cfg->curves && cfg->progress_names && *cfg->progress_names &&
            (rc = s_add(tr, tp_cb_step_writer(cfg->progress_names))) < 0)
            goto out;
    }
    /* a language model's data: tokens_per_s, and validation_bpb beside
     * validation_cost (monitor_text.c) */
    if (cfg->tokens_per_sample > 0 &&
        ((rc = s_add(tr, tp_cb_token_throughput(cfg->tokens_per_sample))) < 0 ||
         (rc = s_add(tr, tp_cb_bits_per_byte(NULL, NULL, cfg->bytes_per_token))) < 0))
        goto out;
    for (size_t i = 0; i < cfg->nmonitors; i++) {
        tp_callback_t *cb = cfg->monitors[i];
        cfg->monitors[i] = NULL;
        if ((rc = s_add(tr, cb)) < 0)
            goto out;
    }
    if (cfg->default_callbacks) {
        if (cfg->logdir && (rc = s_add(tr, tp_cb_observe(tp_cb_json_writer()))) < 0)
            goto out;
        if (cfg->logdir && cfg->tensorboard &&
            (rc = s_add(tr, tp_cb_observe(tp_cb_tfevent_writer(cfg->hparams)))) < 0)
            goto out;
        /* after JSONWriter: it draws the stats.json just written */
        if (cfg->logdir && cfg->curves && cfg->plots &&
            (rc = s_add(tr, tp_cb_observe(tp_cb_curve_plotter()))) < 0)
            goto out;
        if ((rc = s_add(tr, tp_cb_observe(tp_cb_scalar_printer()))) < 0)
            goto out;
    }
    /* SIGINT and SIGTERM end training in order: the current step finishes,
     * after_train runs, the last checkpoint stays the latest. */
    tp_signals_install();
    training = 1;
    rc = tp_trainer_train(tr, &sched);
    tp_signals_restore();
out: {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        if (out_model && rc >= 0 && mt) {
            *out_model = mt->model;
            mt->model = NULL;
        }
        if (tr)
            tp_trainer_destroy(&tr);  /* destroys mt too */
        else if (mt)
            mt_destroy(mt);
        tp_train_config_fini(cfg);
        /* after the trainer: its savers have written their last checkpoint */
        tp_logdir_lock_destroy(&dirlock);
        if (rc < 0 && !training && !dir_existed && cfg->logdir == logdir && !cfg->dist) {
            /* made by this launch, which wrote nothing there but its lock */
            char lock[4200];
            snprintf(lock, sizeof lock, "%s/.lock", logdir);
            unlink(lock);
            rmdir(logdir);
        }
        cfg->logdir = user_logdir;
        /* the batches' blocks kept for reuse are not needed after training */
        tp_alloc_trim();
        if (rc < 0) {
            tp_error(rc, "%s", msg);
            /* logged as well as returned: a program that ignores the status
             * still shows why training stopped (a signal is no error) */
            if (rc == TP_ERR_INTERRUPTED)
                TP_WARN("training stopped: %s", msg);
            else
                TP_ERROR("training failed: %s", msg);
        }
    }
    return rc;
}
