/* towerpack pipeline/train: the GAN trainers (towerpack/gan.h):
 * GANTrainer, SeparateGANTrainer and their data-parallel towers, as
 * tensorpack's examples/GAN/GAN.py trains a GAN.
 *
 * A step (tp_gan_step_run, gan_step.h) is a few named calls on the
 * trainer's thread, on every tower's batch (taken by the trainer that owns
 * the input: gan_run_step here, the launch's supervised step in train.c):
 * the feeds from the batches (s_feeds), the step's noise drawn on each
 * tower's device into its noise input (s_noise), then
 * the runs the trainer's kind makes over every tower (TP_ALL_TOWERS):
 * GANTrainer one forward with the generator's backward, the
 * discriminator's backward over the same forward, the gradients averaged
 * onto tower 0, each group's update (s_update); SeparateGANTrainer a
 * whole training run of each named cost due; the fetches read after the
 * first run (s_fetch).
 *
 * Per-group optimizers: the model owns one optimizer and its slots (every
 * trainable variable has its Adam moments there, whichever group it is
 * in); before a group's update the trainer loads that group's optimizer
 * settings and update count into it (s_load_group), so each group steps
 * as if it had its own optimizer (PyTorch's two Adams). A group's update
 * count is a function of the global step (tp_gan_g_updates), so a resumed
 * run needs no state beyond the checkpoint's global step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/gan.h>
#include <towerpack/log.h>
#include <towerpack/optim.h>
#include <towerpack/philox.h>
#include <towerpack/rng.h>
#include "pipeline/train/gan_step.h"

#define S_MAX_TOWERS 64
#define S_MAX_INPUTS 16

/* The step (pipeline/train/gan_step.h): what a GAN step needs beside the
 * model it borrows. */
struct tp_gan_step {
    tp_model_t *model;            /* borrowed */
    tp_gan_config_t cfg;
    char g_cost[64], d_cost[64];  /* cfg's names point here */
    int towers, ninputs;
    tp_optimizer_t *opt[2];       /* [0] generator, [1] discriminator */
    tp_tensor_t feeds[S_MAX_TOWERS * S_MAX_INPUTS];
};
typedef tp_gan_step_t s_gan_t;

/* The trainer of tp_gan_trainer_new: the step, the model and the input. */
typedef struct {
    tp_gan_step_t *step;
    tp_model_t *model;
    tp_input_t *input;
    int towers;
    tp_datapoint_t *batches[S_MAX_TOWERS];
} s_trainer_t;

enum { S_G = 0, S_D = 1 };

/* ---- configuration ---------------------------------------------------------- */

void tp_gan_config_init(tp_gan_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->g_cost = "g_loss";
    cfg->d_cost = "d_loss";
    cfg->batch = 32;
    cfg->noise_input = -1;
    cfg->noise = TP_GAN_NOISE_UNIFORM;
    cfg->noise_scale = 1.0f;
    cfg->seed = 1;
}

static int s_separate(const tp_gan_config_t *c) { return c->d_period > 0; }

/* Steps s in [0, step) with s % period == 0. */
static int64_t s_due_before(int64_t step, int period) {
    return step <= 0 ? 0 : (step + period - 1) / period;
}

int64_t tp_gan_g_updates(const tp_gan_config_t *cfg, int64_t step) {
    return s_separate(cfg) ? s_due_before(step, cfg->g_period) : (step > 0 ? step : 0);
}

int64_t tp_gan_d_updates(const tp_gan_config_t *cfg, int64_t step) {
    return s_separate(cfg) ? s_due_before(step, cfg->d_period) : (step > 0 ? step : 0);
}

void tp_gan_noise_fill(const tp_gan_config_t *cfg, int64_t step, int64_t row0,
                       int64_t rows, int64_t dim, float *out) {
    /* Philox (towerpack/philox.h): each number a function of (seed, step,
     * row, element) alone, so a row's numbers do not depend on the towers,
     * the batch split or what ran before, and the CUDA kernel
     * (gpu/cuda/noise.cu) draws the same ones to the bit */
    tp_philox_noise_fill(cfg->seed, step, row0, rows, dim,
                         cfg->noise == TP_GAN_NOISE_NORMAL, cfg->noise_scale, out);
}

/* ---- the optimizer of a group ----------------------------------------------- */

static const char *const s_hp_names[] = {"learning_rate", "momentum", "beta1",
                                         "beta2", "epsilon"};

/* Copy every hyper-parameter `from` has into `to` (same kind). */
static tp_status_t s_copy_hparams(tp_optimizer_t *to, const tp_optimizer_t *from) {
    for (size_t i = 0; i < sizeof s_hp_names / sizeof *s_hp_names; i++) {
        double v;
        if (tp_optimizer_get(from, s_hp_names[i], &v) != TP_OK)
            continue;  /* not this kind's */
        TP_TRY(tp_optimizer_set(to, s_hp_names[i], v));
    }
    tp_clear_error();
    return TP_OK;
}

/* The model's optimizer becomes group g's for its next update: its
 * settings, and its update count so far (Adam's bias correction). */
static tp_status_t s_load_group(s_gan_t *a, int g, int64_t step) {
    tp_optimizer_t *mo = tp_model_optimizer(a->model);
    TP_TRY(s_copy_hparams(mo, a->opt[g]));
    tp_optimizer_set_step(mo, g == S_G ? tp_gan_g_updates(&a->cfg, step)
                                       : tp_gan_d_updates(&a->cfg, step));
    return TP_OK;
}

/* ---- the step ------------------------------------------------------------------ */

/* Every tower's batch, its components the feeds of the inputs that are
 * not the noise. */
static tp_status_t s_feeds(s_gan_t *a, tp_datapoint_t *const *batches) {
    const int per = a->ninputs - (a->cfg.noise_input >= 0);
    for (int i = 0; i < a->towers; i++) {
        tp_datapoint_t *dp = batches[i];
        if (tp_datapoint_size(dp) != per)
            return tp_error(TP_ERR_SHAPE, "GAN trainer: tower%d's batch has %d "
                            "components, the model %d inputs%s", i,
                            tp_datapoint_size(dp), a->ninputs,
                            a->cfg.noise_input >= 0 ? " (one of them the noise)" : "");
        tp_tensor_t views[S_MAX_INPUTS];
        tp_datapoint_views(dp, views, S_MAX_INPUTS);
        for (int k = 0, c = 0; k < a->ninputs; k++)
            if (k != a->cfg.noise_input)
                a->feeds[i * a->ninputs + k] = views[c++];
    }
    return TP_OK;
}

/* The step's noise: tower i's rows are rows i x batch ... of the step's,
 * as many as its batch has, drawn by the tower's backend into the tower's
 * noise input on its device (tp_model_fill_noise: a kernel on a GPU, the
 * host's Philox on the CPU, the bits of tp_gan_noise_fill either way), so
 * no noise crosses the host->device copy; the feed is the model's view of
 * that input, which the step's runs read in place. */
static tp_status_t s_noise(s_gan_t *a, int64_t step) {
    const int z = a->cfg.noise_input;
    if (z < 0)
        return TP_OK;
    for (int i = 0; i < a->towers; i++) {
        const tp_tensor_t *first = &a->feeds[i * a->ninputs + (z == 0 ? 1 : 0)];
        int64_t rows = a->ninputs > 1 && first->ndim > 0 ? first->shape[0] : a->cfg.batch;
        if (rows > a->cfg.batch)
            return tp_error(TP_ERR_SHAPE, "GAN trainer: tower%d's batch has %lld "
                            "rows, more than the %lld planned", i, (long long)rows,
                            (long long)a->cfg.batch);
        tp_status_t rc = tp_model_fill_noise(a->model, i, z, a->cfg.seed, step,
                                             i * a->cfg.batch, rows,
                                             a->cfg.noise == TP_GAN_NOISE_NORMAL,
                                             a->cfg.noise_scale,
                                             &a->feeds[i * a->ninputs + z]);
        if (rc < 0)
            return tp_error_wrap(rc, "GAN trainer: step %lld's noise for tower%d",
                                 (long long)step, i);
    }
    return TP_OK;
}

/* A run over every tower: `stages` of cost `cost` (NULL: none named). */
static tp_status_t s_run(s_gan_t *a, unsigned stages, const char *cost, const char *what) {
    tp_run_opts_t o = {.stages = stages, .cost = cost};
    const int fwd = (stages & TP_RUN_FORWARD) != 0;
    tp_status_t rc = tp_model_run(a->model, TP_ALL_TOWERS, fwd ? a->feeds : NULL,
                                  fwd ? a->towers * a->ninputs : 0, NULL, 0, &o);
    return rc < 0 ? tp_error_wrap(rc, "GAN trainer: %s", what) : TP_OK;
}

/* Group g's update from its fresh (or held) gradients, with its own
 * optimizer. `stages`: TP_RUN_UPDATE, or TP_RUN_TRAIN for a whole run of
 * its cost (forward and backward first). */
static tp_status_t s_update(s_gan_t *a, int g, int64_t step, unsigned stages) {
    TP_TRY(s_load_group(a, g, step));
    TP_TRY(s_run(a, stages, g == S_G ? a->g_cost : a->d_cost,
                 g == S_G ? "the generator's update" : "the discriminator's update"));
    /* the group's optimizer keeps what the update changed (its count) */
    tp_optimizer_set_step(a->opt[g], tp_optimizer_step(tp_model_optimizer(a->model)));
    return TP_OK;
}

/* What the callbacks asked for: the mean over the towers of the named
 * outputs, as the last run computed them. */
static void s_fetch(s_gan_t *a, tp_fetches_t *f) {
    for (int k = 0; k < tp_fetches_count(f); k++) {
        const char *name = tp_fetches_name(f, k);
        double mean;
        if (tp_model_fetch_mean(a->model, a->towers, name, &mean))
            tp_fetches_set(f, name, mean);
    }
    tp_clear_error();  /* a name this model lacks is not an error */
}

tp_status_t tp_gan_step_run(tp_gan_step_t *a, tp_datapoint_t *const *batches,
                            int64_t step, tp_fetches_t *f) {
    TP_TRY(s_feeds(a, batches));
    TP_TRY(s_noise(a, step));
    if (!s_separate(&a->cfg)) {
        /* GANTrainer, as tensorpack's graph runs it: one forward pass at
         * the step's weights (batch norm's moving averages move once),
         * both players' gradients from it (the discriminator's on the
         * fakes of the generator before its update: d_min's control
         * dependency on g_min orders the applies, not the forward pass),
         * the towers' averaged, then the generator's update, then the
         * discriminator's. The discriminator's backward runs over the
         * activations the first run left (a backward-only run), and the
         * model holds the generator's gradients through it (their
         * variables are disjoint). */
        TP_TRY(s_run(a, TP_RUN_GRADIENTS, a->g_cost, "the generator's gradients"));
        if (f)
            s_fetch(a, f);
        TP_TRY(s_run(a, TP_RUN_BACKWARD, a->d_cost, "the discriminator's gradients"));
        TP_TRY(s_run(a, TP_RUN_REDUCE, NULL, "the towers' mean gradients"));
        TP_TRY(s_update(a, S_G, step, TP_RUN_UPDATE));
        return s_update(a, S_D, step, TP_RUN_UPDATE);
    }
    /* SeparateGANTrainer: a run of each cost due, d first (tensorpack's
     * run_step order), each its own forward pass */
    int order[2], n = 0;
    if (step % a->cfg.d_period == 0)
        order[n++] = S_D;
    if (step % a->cfg.g_period == 0)
        order[n++] = S_G;
    for (int k = 0; k < n; k++) {
        TP_TRY(s_update(a, order[k], step, TP_RUN_TRAIN));
        if (k == 0 && f)
            s_fetch(a, f);  /* at the step's starting weights */
    }
    return TP_OK;
}

/* ---- the trainer over a model and an input ----------------------------------- */

static void s_give_back(s_trainer_t *t) {
    for (int i = 0; i < t->towers; i++)
        if (t->batches[i])
            tp_input_release(t->input, i, &t->batches[i]);
}

/* Every tower's batch, in tower order (the data order is deterministic),
 * then the step. */
static tp_status_t gan_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_trainer_t *t = impl;
    tp_status_t rc = TP_OK;
    for (int i = 0; rc >= 0 && i < t->towers; i++) {
        rc = tp_input_next(t->input, i, &t->batches[i]);
        if (rc < 0)
            rc = tp_error_wrap(rc, "GAN trainer: tower%d input", i);
    }
    if (rc >= 0)
        rc = tp_gan_step_run(t->step, t->batches, tp_trainer_global_step(tr), f);
    s_give_back(t);
    return rc;
}

static tp_status_t gan_setup(void *impl, tp_trainer_t *tr) {
    s_trainer_t *t = impl;
    /* a resumed run's global step is set before training: replay the
     * input to it */
    tp_status_t rc = tp_input_start(t->input, t->towers, t->step->cfg.seed,
                                    tp_trainer_global_step(tr) * t->towers);
    return rc < 0 ? tp_error_wrap(rc, "GAN trainer: starting %s",
                                  tp_input_name(t->input))
                  : TP_OK;
}

/* "g/NAME", "d/NAME": one group's; "NAME": both (reading: the generator's). */
tp_status_t tp_gan_step_set_hparam(tp_gan_step_t *a, const char *name, double v) {
    if (!strncmp(name, "g/", 2))
        return tp_optimizer_set(a->opt[S_G], name + 2, v);
    if (!strncmp(name, "d/", 2))
        return tp_optimizer_set(a->opt[S_D], name + 2, v);
    TP_TRY(tp_optimizer_set(a->opt[S_G], name, v));
    return tp_optimizer_set(a->opt[S_D], name, v);
}

tp_status_t tp_gan_step_get_hparam(const tp_gan_step_t *a, const char *name, double *v) {
    if (!strncmp(name, "d/", 2))
        return tp_optimizer_get(a->opt[S_D], name + 2, v);
    return tp_optimizer_get(a->opt[S_G], !strncmp(name, "g/", 2) ? name + 2 : name, v);
}

void tp_gan_step_destroy(tp_gan_step_t **self_p) {
    if (!self_p || !*self_p)
        return;
    s_gan_t *a = *self_p;
    tp_optimizer_destroy(&a->opt[S_G]);
    tp_optimizer_destroy(&a->opt[S_D]);
    free(a);
    *self_p = NULL;
}

static tp_status_t gan_set_hp(void *impl, const char *name, double v) {
    return tp_gan_step_set_hparam(((s_trainer_t *)impl)->step, name, v);
}
static tp_status_t gan_get_hp(void *impl, const char *name, double *v) {
    return tp_gan_step_get_hparam(((s_trainer_t *)impl)->step, name, v);
}
static int64_t gan_samples(void *impl) {
    s_trainer_t *t = impl;
    return t->step->cfg.batch * t->towers;
}
static tp_model_t *gan_model(void *impl) { return ((s_trainer_t *)impl)->model; }

static void gan_destroy(void *impl) {
    s_trainer_t *t = impl;
    if (!t)
        return;
    s_give_back(t);
    tp_gan_step_destroy(&t->step);
    tp_input_destroy(&t->input);
    tp_model_destroy(&t->model);
    free(t);
}

/* One trainer under both of tensorpack's names (the step's periods tell
 * them apart); the name is what its errors and logs say. */
#define S_GAN_OPS(NAME)                                                        \
    {.name = (NAME), .setup = gan_setup, .run_step = gan_run_step,             \
     .set_hyperparam = gan_set_hp, .get_hyperparam = gan_get_hp,               \
     .samples_per_step = gan_samples, .model = gan_model, .destroy = gan_destroy}

static const tp_trainer_ops_t s_gan_ops = S_GAN_OPS("GANTrainer");
static const tp_trainer_ops_t s_separate_ops = S_GAN_OPS("SeparateGANTrainer");

/* ---- construction ------------------------------------------------------------ */

/* Group g's optimizer: the factory's, or a copy of the model's settings;
 * of the model's optimizer's kind (the model's slots serve it). */
static tp_status_t s_group_optimizer(s_gan_t *a, int g, tp_optimizer_fn fn) {
    const char *who = g == S_G ? "generator" : "discriminator";
    tp_optimizer_t *mo = tp_model_optimizer(a->model);
    if (fn) {
        a->opt[g] = fn(a->cfg.optimizer_user);
        if (!a->opt[g])
            return tp_error(TP_ERR_INVALID, "GAN trainer: the %s's optimizer "
                            "factory returned none (%s)", who, tp_last_error());
    } else {
        a->opt[g] = strcmp(tp_optimizer_kind(mo), "adam") == 0
                        ? tp_optimizer_adam(1e-3, 0.9, 0.999, 1e-8)
                        : tp_optimizer_sgd(0.01, 0, 0);
        if (!a->opt[g])
            return tp_error(TP_ERR_NOMEM, "GAN trainer: the %s's optimizer", who);
        /* SGD's momentum 0 keeps no slot: raise it to the model's first */
        double mom;
        if (tp_optimizer_get(mo, "momentum", &mom) == TP_OK && mom > 0) {
            tp_optimizer_destroy(&a->opt[g]);
            a->opt[g] = tp_optimizer_sgd(0.01, mom, 0);
            if (!a->opt[g])
                return tp_error(TP_ERR_NOMEM, "GAN trainer: the %s's optimizer", who);
        }
        tp_clear_error();
        TP_TRY(s_copy_hparams(a->opt[g], mo));
    }
    if (strcmp(tp_optimizer_kind(a->opt[g]), tp_optimizer_kind(mo)) != 0 ||
        tp_optimizer_slot_count(a->opt[g]) != tp_optimizer_slot_count(mo))
        return tp_error(TP_ERR_INVALID, "GAN trainer: the %s's optimizer is %s "
                        "with %d slots, the model's %s with %d: the model's slots "
                        "hold both groups' state, so their kinds must agree", who,
                        tp_optimizer_kind(a->opt[g]), tp_optimizer_slot_count(a->opt[g]),
                        tp_optimizer_kind(mo), tp_optimizer_slot_count(mo));
    return TP_OK;
}

static tp_status_t s_check(s_gan_t *a) {
    const tp_gan_config_t *c = &a->cfg;
    if (!a->model)
        return tp_error(TP_ERR_INVALID, "GAN trainer: a model is needed (%s)",
                        tp_last_error());
    if (!tp_model_optimizer(a->model))
        return tp_error(TP_ERR_INVALID, "GAN trainer: the model has no optimizer");
    if ((c->d_period || c->g_period) &&
        (c->d_period < 1 || c->g_period < 1 || (c->d_period != 1 && c->g_period != 1)))
        return tp_error(TP_ERR_INVALID, "GAN trainer: d_period %d, g_period %d: "
                        "both 0 (GANTrainer), or both >= 1 with one of them 1 "
                        "(SeparateGANTrainer)", c->d_period, c->g_period);
    if (a->towers < 1 || a->towers > S_MAX_TOWERS || a->ninputs > S_MAX_INPUTS)
        return tp_error(TP_ERR_INVALID, "GAN trainer: %d towers (1..%d), %d inputs "
                        "(at most %d)", a->towers, S_MAX_TOWERS, a->ninputs, S_MAX_INPUTS);
    if (c->batch < 1)
        return tp_error(TP_ERR_INVALID, "GAN trainer: batch %lld", (long long)c->batch);
    const char *names[2] = {c->g_cost, c->d_cost};
    for (int g = 0; g < 2; g++) {
        int found = 0;
        for (int i = 0; names[g] && i < tp_model_cost_count(a->model); i++)
            found |= strcmp(tp_model_cost_name(a->model, i), names[g]) == 0;
        if (!found || strlen(names[g]) >= sizeof a->g_cost)
            return tp_error(TP_ERR_NOT_FOUND, "GAN trainer: the model has no cost "
                            "named '%s' (the %s's: tp_tower_add_cost)",
                            names[g] ? names[g] : "(null)",
                            g == S_G ? "generator" : "discriminator");
    }
    if (c->noise_input >= a->ninputs)
        return tp_error(TP_ERR_INVALID, "GAN trainer: noise input %d, the model has "
                        "%d inputs", c->noise_input, a->ninputs);
    if (c->noise_input >= 0) {
        const tp_input_desc_t *d = tp_model_input_desc(a->model, c->noise_input);
        if (d->dtype != TP_FLOAT32 || d->ndim < 2)
            return tp_error(TP_ERR_INVALID, "GAN trainer: the noise input '%s' must "
                            "be float32 [-1, ...]", d->name);
    }
    return TP_OK;
}

tp_gan_step_t *tp_gan_step_new(tp_model_t *model, const tp_gan_config_t *cfg) {
    s_gan_t *a = calloc(1, sizeof *a);
    if (!a) {
        tp_error(TP_ERR_NOMEM, "GAN trainer");
        return NULL;
    }
    a->model = model;
    a->cfg = *cfg;
    a->towers = model ? tp_model_tower_count(model) : 0;
    a->ninputs = model ? tp_model_input_count(model) : 0;
    tp_status_t rc = s_check(a);
    if (rc >= 0) {
        snprintf(a->g_cost, sizeof a->g_cost, "%s", cfg->g_cost);
        snprintf(a->d_cost, sizeof a->d_cost, "%s", cfg->d_cost);
        a->cfg.g_cost = a->g_cost;
        a->cfg.d_cost = a->d_cost;
        rc = s_group_optimizer(a, S_G, cfg->g_optimizer);
    }
    if (rc >= 0)
        rc = s_group_optimizer(a, S_D, cfg->d_optimizer);
    if (rc < 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        tp_gan_step_destroy(&a);
        tp_error(rc, "%s", msg);
        return NULL;
    }
    return a;
}

tp_trainer_t *tp_gan_trainer_new(tp_model_t *model, tp_input_t *input,
                                 const tp_gan_config_t *cfg) {
    s_trainer_t *t = calloc(1, sizeof *t);
    if (!t || !input) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        free(t);
        tp_model_destroy(&model);
        tp_input_destroy(&input);
        if (t)
            tp_error(TP_ERR_INVALID, "GAN trainer: no input (%s)", msg);
        else
            tp_error(TP_ERR_NOMEM, "GAN trainer");
        return NULL;
    }
    t->model = model;
    t->input = input;
    t->towers = model ? tp_model_tower_count(model) : 0;
    if (!(t->step = tp_gan_step_new(model, cfg))) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        gan_destroy(t);
        tp_error(TP_ERR_INVALID, "%s", msg);
        return NULL;
    }
    return tp_trainer_new(s_separate(cfg) ? &s_separate_ops : &s_gan_ops, t);
}
