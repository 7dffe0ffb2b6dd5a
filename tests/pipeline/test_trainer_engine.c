/* towerpack tests: the engine through launch_train_with_config, for each
 * trainer: the hooks' order and counts (SimpleTrainer, Replicated and
 * ParameterServer with two towers), ModelSaver's max_to_keep and
 * keep_checkpoint_every_n_hours, and the step watchdog naming the starved
 * input. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <stdlib.h>
#include <towerpack/checkpoint.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include "train_testutil.h"

#define NPOINTS 192

static tp_dataflow_t *s_blobs(int batch) { return tu_blobs(NPOINTS, 2, 0.5f, 3, batch, 1, 0); }

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *logits = tp_fc(t, "fc", in[0], 2, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}
static tp_optimizer_t *s_opt(void *user) { return tp_optimizer_sgd(0.1, 0.9, 0); }
static const tp_input_desc_t s_inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"label", TP_INT32, 1, {-1}},
};
static const tp_model_desc_t s_model = {s_inputs, 2, s_tower, s_opt, NULL};

static char *s_tmp(void) {
    static char d[64];
    snprintf(d, sizeof d, "/tmp/tp-engine-XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void s_rm(const char *d) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    cr_assert_eq(system(cmd), 0);
}

/* ---- hook order for every trainer ------------------------------------- */

typedef struct {
    char log[16384];
    size_t len;
    int64_t samples;
    double cost;
} s_rec_t;

static void s_log(s_rec_t *r, const char *what) {
    r->len += (size_t)snprintf(r->log + r->len, sizeof r->log - r->len, "%s%s",
                               r->len ? " " : "", what);
}

#define HOOK(name)                                                          \
    static tp_status_t rec_##name(void *impl, tp_trainer_t *tr) {          \
        s_log(impl, #name);                                                 \
        return TP_OK;                                                       \
    }
HOOK(setup_graph)
HOOK(before_train)
HOOK(before_epoch)
HOOK(trigger_step)
HOOK(after_epoch)
HOOK(trigger_epoch)
HOOK(trigger)
HOOK(after_train)

static tp_status_t rec_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_log(impl, "before_run");
    ((s_rec_t *)impl)->samples = tp_trainer_samples_per_step(tr);
    return tp_fetches_request(f, "cost");
}

static tp_status_t rec_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_log(impl, "after_run");
    cr_assert_eq(tp_fetches_get(f, "cost", &((s_rec_t *)impl)->cost), TP_OK);
    return TP_OK;
}

static const tp_callback_ops_t s_rec_ops = {
    .name = "Recorder", .setup_graph = rec_setup_graph,
    .before_train = rec_before_train, .before_epoch = rec_before_epoch,
    .before_run = rec_before_run, .after_run = rec_after_run,
    .trigger_step = rec_trigger_step, .after_epoch = rec_after_epoch,
    .trigger_epoch = rec_trigger_epoch, .trigger = rec_trigger,
    .after_train = rec_after_train,
};

/* trigger_epoch stands for trigger when a callback has it (tensorpack). */
static void s_expect(char *buf, size_t size, int epochs, int steps) {
    size_t n = (size_t)snprintf(buf, size, "setup_graph before_train");
    for (int e = 0; e < epochs; e++) {
        n += (size_t)snprintf(buf + n, size - n, " before_epoch");
        for (int s = 0; s < steps; s++)
            n += (size_t)snprintf(buf + n, size - n, " before_run after_run trigger_step");
        n += (size_t)snprintf(buf + n, size - n, " after_epoch trigger_epoch");
    }
    snprintf(buf + n, size - n, " after_train");
}

static void s_hook_case(tp_trainer_kind_t kind, int towers) {
    s_rec_t *r = calloc(1, sizeof *r);
    tp_callback_t *cbs[1] = {tp_callback_new(&s_rec_ops, r, 0)};
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.trainer = kind;
    c.towers = towers;
    c.batch = 16;
    c.dataflow = s_blobs(16);
    c.callbacks = cbs;
    c.ncallbacks = 1;
    c.max_epoch = 2;
    c.steps_per_epoch = 3;
    c.threads = 1;
    c.stats = "off";
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    char expect[16384];
    s_expect(expect, sizeof expect, 2, 3);
    cr_assert_str_eq(r->log, expect, "trainer kind %d, %d towers", (int)kind, towers);
    cr_assert_eq(r->samples, 16 * towers);
    cr_assert(r->cost > 0 && r->cost < 5, "cost %g", r->cost);
    tp_model_destroy(&m);
    free(r);
}

Test(engine, hook_order_simple_trainer) { s_hook_case(TP_TRAINER_SIMPLE, 1); }
Test(engine, hook_order_replicated_trainer) { s_hook_case(TP_TRAINER_REPLICATED, 2); }
Test(engine, hook_order_parameter_server_trainer) {
    s_hook_case(TP_TRAINER_PARAMETER_SERVER, 2);
}

/* ---- several callbacks, starting_epoch > 1 and resume ------------------- */

/* One shared log of "NAME.hook@epoch/global_step" for the synchronous
 * callbacks (all on the trainer's thread), and one of its own for the
 * observer (on the callback actor). */
typedef struct {
    char name[8];
    char *log;
    size_t *len, cap;
} s_tag_t;

static void s_tag(s_tag_t *t, tp_trainer_t *tr, const char *hook) {
    *t->len += (size_t)snprintf(t->log + *t->len, t->cap - *t->len, "%s%s.%s@%lld/%lld",
                                *t->len ? " " : "", t->name, hook,
                                (long long)tp_trainer_epoch_num(tr),
                                (long long)tp_trainer_global_step(tr));
}

#define TAG(name)                                                           \
    static tp_status_t tag_##name(void *impl, tp_trainer_t *tr) {          \
        s_tag(impl, tr, #name);                                             \
        return TP_OK;                                                       \
    }
TAG(setup_graph)
TAG(before_train)
TAG(before_epoch)
TAG(trigger_step)
TAG(after_epoch)
TAG(trigger_epoch)
TAG(trigger)
TAG(after_train)
static tp_status_t tag_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_tag(impl, tr, "before_run");
    return tp_fetches_request(f, "cost");
}
static tp_status_t tag_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    double cost = -1;
    cr_assert_eq(tp_fetches_get(f, "cost", &cost), TP_OK, "%s", tp_last_error());
    s_tag(impl, tr, "after_run");
    return TP_OK;
}

/* every hook */
static const tp_callback_ops_t s_tag_all_ops = {
    .name = "Tag", .setup_graph = tag_setup_graph, .before_train = tag_before_train,
    .before_epoch = tag_before_epoch, .before_run = tag_before_run,
    .after_run = tag_after_run, .trigger_step = tag_trigger_step,
    .after_epoch = tag_after_epoch, .trigger_epoch = tag_trigger_epoch,
    .after_train = tag_after_train, .destroy = free,
};
/* a callback with only trigger (and trigger_step), for PeriodicTrigger */
static const tp_callback_ops_t s_tag_trigger_ops = {
    .name = "TagTrigger", .trigger_step = tag_trigger_step, .trigger = tag_trigger,
    .destroy = free,
};

static tp_callback_t *s_tagger(const tp_callback_ops_t *ops, const char *name,
                               char *log, size_t *len, size_t cap) {
    s_tag_t *t = calloc(1, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->log = log;
    t->len = len;
    t->cap = cap;
    return tp_callback_new(ops, t, 0);
}

/* What the seeds define, written out: every hook point in tensorpack's
 * order, and at each point the callbacks in registration order: A (every
 * hook), P (A's hooks under PeriodicCallback every 2 epochs: its epoch and
 * step hooks only in even epochs), T (trigger_step, and trigger under
 * PeriodicTrigger every 4 global steps). `only` != 0 writes one
 * callback's hooks alone, as the observer O (A's hooks on the callback
 * actor) sees them. */
static void s_expect_tree(char *buf, size_t size, char only, int64_t start,
                          int64_t max, int64_t steps) {
    size_t n = 0;
    int64_t g = (start - 1) * steps;
#define PUT(who, hook, e, gs)                                                 \
    if (!only || only == (who)[0])                                            \
        n += (size_t)snprintf(buf + n, size - n, "%s%s.%s@%lld/%lld", n ? " " : "", \
                              only ? "O" : (who), hook, (long long)(e), (long long)(gs))
    const int64_t e0 = start - 1;
    PUT("A", "setup_graph", e0, g); PUT("P", "setup_graph", e0, g);
    /* an observer's before_run also runs once at setup, to learn the names
     * to fetch for it (tp_cb_observe) */
    if (only) { PUT("A", "before_run", e0, g); }
    PUT("A", "before_train", e0, g); PUT("P", "before_train", e0, g);
    for (int64_t e = start; e <= max; e++) {
        int even = e % 2 == 0;
        PUT("A", "before_epoch", e, g);
        if (even) { PUT("P", "before_epoch", e, g); }
        for (int64_t s = 0; s < steps; s++) {
            PUT("A", "before_run", e, g);
            if (even) { PUT("P", "before_run", e, g); }
            g++;
            PUT("A", "after_run", e, g);
            if (even) { PUT("P", "after_run", e, g); }
            PUT("A", "trigger_step", e, g);
            if (even) { PUT("P", "trigger_step", e, g); }
            PUT("T", "trigger_step", e, g);
            if (g % 4 == 0) { PUT("T", "trigger", e, g); }
        }
        PUT("A", "after_epoch", e, g);
        if (even) { PUT("P", "after_epoch", e, g); }
        PUT("A", "trigger_epoch", e, g);
        if (even) { PUT("P", "trigger_epoch", e, g); }
    }
    PUT("A", "after_train", max, g); PUT("P", "after_train", max, g);
#undef PUT
}

#define TREE_LOG 65536
static char s_sync_log[TREE_LOG], s_obs_log[TREE_LOG];
static size_t s_sync_len, s_obs_len;

/* Train `towers` towers with A, P, T and the observer O (A's hooks on the
 * callback actor), epochs start..max of `steps` steps; resume: from the
 * logdir's checkpoint instead of an explicit starting_epoch. */
static void s_tree_run(int towers, const char *logdir, int64_t start, int64_t max,
                       int resume, int record) {
    s_sync_len = s_obs_len = 0;
    s_sync_log[0] = s_obs_log[0] = '\0';
    tp_callback_t *cbs[4] = {
        s_tagger(&s_tag_all_ops, "A", s_sync_log, &s_sync_len, TREE_LOG),
        tp_cb_periodic_callback(
            s_tagger(&s_tag_all_ops, "P", s_sync_log, &s_sync_len, TREE_LOG), 2),
        tp_cb_periodic_trigger(
            s_tagger(&s_tag_trigger_ops, "T", s_sync_log, &s_sync_len, TREE_LOG), 4, 0),
        tp_cb_observe(s_tagger(&s_tag_all_ops, "O", s_obs_log, &s_obs_len, TREE_LOG)),
    };
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.towers = towers;
    c.batch = 16;
    c.dataflow = s_blobs(16);
    c.callbacks = record ? cbs : NULL;
    c.ncallbacks = record ? 4 : 0;
    c.max_epoch = max;
    c.steps_per_epoch = 3;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    c.logdir = logdir;
    c.auto_resume = resume;
    if (!resume)
        c.starting_epoch = start;
    if (!record)
        for (int i = 0; i < 4; i++)
            tp_callback_destroy(&cbs[i]);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
}

static void s_tree_case(int towers) {
    char expect[TREE_LOG];
    char *dir = s_tmp();
    /* starting_epoch 3: global step starts at 2 x 3 */
    s_tree_run(towers, NULL, 3, 5, 0, 1);
    s_expect_tree(expect, sizeof expect, 0, 3, 5, 3);
    cr_assert_str_eq(s_sync_log, expect, "%d towers, starting_epoch 3", towers);
    s_expect_tree(expect, sizeof expect, 'A', 3, 5, 3);
    cr_assert_str_eq(s_obs_log, expect, "the observer, %d towers", towers);
    /* resume: epochs 1-2 saved, then a run with auto_resume goes on at 3 */
    s_tree_run(towers, dir, 1, 2, 0, 0);
    s_tree_run(towers, dir, 0, 5, 1, 1);
    s_expect_tree(expect, sizeof expect, 0, 3, 5, 3);
    /* ModelSaver (registered after the user's callbacks) is not tagged */
    cr_assert_str_eq(s_sync_log, expect, "%d towers, resumed", towers);
    s_expect_tree(expect, sizeof expect, 'A', 3, 5, 3);
    cr_assert_str_eq(s_obs_log, expect, "the observer, %d towers, resumed", towers);
    s_rm(dir);
}

Test(engine, hook_order_of_several_callbacks_from_a_later_epoch_and_resumed) {
    s_tree_case(1);
}

Test(engine, hook_order_of_several_callbacks_two_towers) { s_tree_case(2); }

/* ParameterServer and Replicated compute the same update from the same
 * batches: the variables agree after training. */
Test(engine, parameter_server_matches_replicated) {
    tp_model_t *m[2] = {NULL, NULL};
    tp_trainer_kind_t kinds[2] = {TP_TRAINER_REPLICATED, TP_TRAINER_PARAMETER_SERVER};
    for (int k = 0; k < 2; k++) {
        tp_train_config_t c;
        tp_train_config_init(&c);
        c.model = &s_model;
        c.trainer = kinds[k];
        c.towers = 2;
        c.batch = 16;
        c.dataflow = s_blobs(16);
        c.max_epoch = 2;
        c.threads = 1;
        c.stats = "off";
        c.default_callbacks = 0;
        cr_assert_eq(tp_launch_train_with_config(&c, &m[k]), TP_OK, "%s", tp_last_error());
    }
    for (int i = 0; i < tp_model_var_count(m[0]); i++) {
        const char *name = tp_model_var_name(m[0], i);
        tp_tensor_t a, b;
        cr_assert_eq(tp_model_var(m[0], name, &a), TP_OK);
        cr_assert_eq(tp_model_var(m[1], name, &b), TP_OK);
        for (size_t j = 0; j < tp_tensor_numel(&a); j++)
            cr_assert_float_eq(((float *)a.data)[j], ((float *)b.data)[j], 1e-5f,
                               "%s[%zu]", name, j);
    }
    tp_model_destroy(&m[0]);
    tp_model_destroy(&m[1]);
}

/* ---- ModelSaver -------------------------------------------------------- */

static int s_count_ckpts(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, "model-", 6) == 0;
    closedir(d);
    return n;
}

static void s_saver_run(const char *dir, double keep_hours) {
    tp_callback_t *cbs[1] = {tp_cb_model_saver(2, keep_hours)};
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 16;
    c.dataflow = s_blobs(16);
    c.callbacks = cbs;
    c.ncallbacks = 1;
    c.save_checkpoints = 0;  /* only ours */
    c.max_epoch = 5;
    c.steps_per_epoch = 2;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    c.logdir = dir;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
}

Test(engine, model_saver_keeps_the_newest_max_to_keep) {
    char *dir = s_tmp();
    s_saver_run(dir, 0);
    cr_assert_eq(s_count_ckpts(dir), 2);
    char p[256];
    snprintf(p, sizeof p, "%s/model-8.safetensors", dir);
    cr_assert_eq(access(p, R_OK), 0);
    snprintf(p, sizeof p, "%s/model-10.safetensors", dir);
    cr_assert_eq(access(p, R_OK), 0);
    char latest[256];
    cr_assert_eq(tp_checkpoint_find_latest(dir, latest, sizeof latest), TP_OK);
    cr_assert_str_eq(latest, p);
    s_rm(dir);
}

Test(engine, model_saver_keeps_one_every_n_hours_for_good) {
    char *dir = s_tmp();
    /* every pruned checkpoint is older than the last one kept for good by
     * more than a nanosecond-scale "n hours": all stay */
    s_saver_run(dir, 1e-13);
    cr_assert_eq(s_count_ckpts(dir), 5);
    s_rm(dir);
    /* a long period: the pruned ones go, as without it */
    dir = s_tmp();
    s_saver_run(dir, 1000);
    cr_assert_eq(s_count_ckpts(dir), 2);
    s_rm(dir);
}

Test(engine, model_saver_refuses_max_to_keep_zero) {
    cr_assert_null(tp_cb_model_saver(0, 0));
    cr_assert(strstr(tp_last_error(), "max_to_keep"), "%s", tp_last_error());
}

/* ---- the step watchdog ------------------------------------------------- */

/* A dataflow that takes 0.5 s per batch. */
static tp_status_t slow_next(void *impl, tp_datapoint_t **out) {
    usleep(500000);
    int64_t one[] = {1, 2}, lab[] = {1};
    *out = tp_datapoint_new(2);
    tp_tensor_init_zero(tp_datapoint_get(*out, 0), TP_FLOAT32, 2, one);
    tp_tensor_init_zero(tp_datapoint_get(*out, 1), TP_INT32, 1, lab);
    return TP_OK;
}
static int64_t slow_size(void *impl) { return -1; }
static const tp_dataflow_ops_t s_slow_ops = {.name = "slowpoke", .next = slow_next,
                                             .size = slow_size};

static void s_watchdog_case(int towers, const char *needle) {
    char *dir = s_tmp();
    char log[128];
    snprintf(log, sizeof log, "%s/log.log", dir);
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 1;
    c.towers = towers;
    c.dataflow = tp_dataflow_new(&s_slow_ops, NULL);
    c.max_epoch = 1;
    c.steps_per_epoch = 1;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    c.watchdog_s = 0.2;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    tp_log_set_file(NULL);
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_assert(strstr(buf, "step watchdog") && strstr(buf, needle), "log:\n%s", buf);
    s_rm(dir);
}

Test(engine, watchdog_names_the_starving_queue_input) {
    s_watchdog_case(1, "QueueInput, dataflow slowpoke");
}

Test(engine, watchdog_names_the_starving_staging_input) {
    s_watchdog_case(2, "StagingInput stage is starved by the input QueueInput");
}

/* ---- MinSaver and MaxSaver --------------------------------------------- */

/* Puts "val" = a fixed sequence, one value per epoch. */
static const double s_vals[5] = {3, 1, 2, 0.5, 4};
static tp_status_t val_trigger_epoch(void *impl, tp_trainer_t *tr) {
    tp_trainer_put_scalar(tr, "val", s_vals[tp_trainer_epoch_num(tr) - 1]);
    return TP_OK;
}
static const tp_callback_ops_t s_val_ops = {.name = "Val", .trigger_epoch = val_trigger_epoch};

static int64_t s_saved_step(const char *dir, const char *file) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(p, &st), TP_OK, "%s", tp_last_error());
    const char *g = tp_safetensors_meta(st, "global_step");
    cr_assert_not_null(g);
    int64_t step = strtoll(g, NULL, 10);
    tp_safetensors_destroy(&st);
    return step;
}

Test(engine, min_and_max_saver_keep_the_best_epoch) {
    char *dir = s_tmp();
    tp_callback_t *cbs[3] = {tp_callback_new(&s_val_ops, NULL, 0),
                             tp_cb_min_saver("val", NULL),
                             tp_cb_max_saver("val", "best.safetensors")};
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 16;
    c.dataflow = s_blobs(16);
    c.callbacks = cbs;
    c.ncallbacks = 3;
    c.save_checkpoints = 0;
    c.max_epoch = 5;
    c.steps_per_epoch = 2;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    c.logdir = dir;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    /* the minimum 0.5 came after epoch 4, the maximum 4 after epoch 5 */
    cr_assert_eq(s_saved_step(dir, "min-val.safetensors"), 4 * 2);
    cr_assert_eq(s_saved_step(dir, "best.safetensors"), 5 * 2);
    s_rm(dir);
}
