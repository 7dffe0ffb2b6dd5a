/* towerpack tests: the GAN trainers (towerpack/gan.h) on a tiny GAN of 2-D
 * points: a generator gen/ (z[4] -> fc 16 -> tanh -> fc 2) and a
 * discriminator discrim/ (fc 16 -> tanh -> fc 2) applied to the real and
 * the fake points with the same variables. Sigmoid cross-entropy is not an
 * op yet (the op-set issue): softmax cross-entropy over 2 logits stands in
 * for it (class 1 "real"; it is the sigmoid cross-entropy of l1 - l0), its
 * labels (all ones, all zeros) coming with the batches.
 *
 * Checks: a step is the updates the trainer's kind says, in its order, on
 * the step's batch and noise (the same numbers, bit for bit, as the runs
 * made by hand); GANTrainer's step is one forward pass (the zoo's DCGAN:
 * batch norm's moving averages moved once, the weights those of a fresh
 * forward for each player); each update moves its own group only;
 * SeparateGANTrainer's periods; two towers update as one tower on the
 * concatenated batch; a backward-only run over a held forward gives a
 * fresh forward's gradients; a stopped and resumed run ends bit-identical
 * to an unbroken one; the GAN's
 * monitors; and, where /usr/bin/python3 has torch, the same tiny GAN in
 * PyTorch from the same weights, batches and noise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include <towerpack/gan.h>
#include <towerpack/models.h>
#include <towerpack/philox.h>

#include "gan_testutil.h"
#include "dir_testutil.h"

/* ---- reading the model ------------------------------------------------------- */

#define S_NVARS 8

typedef struct {
    int n;
    char name[S_NVARS][32];
    float *v[S_NVARS];
    size_t count[S_NVARS];
} s_snap_t;

static void s_snap(tp_model_t *m, s_snap_t *s) {
    s->n = 0;
    for (int i = 0; i < tp_model_var_count(m); i++) {
        if (!tp_model_var_trainable(m, i))
            continue;
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, tp_model_var_name(m, i), &v), TP_OK);
        cr_assert_lt(s->n, S_NVARS);
        snprintf(s->name[s->n], sizeof s->name[0], "%s", tp_model_var_name(m, i));
        s->count[s->n] = tp_tensor_numel(&v);
        s->v[s->n] = malloc(v.nbytes);
        memcpy(s->v[s->n], v.data, v.nbytes);
        s->n++;
    }
}

static void s_snap_free(s_snap_t *s) {
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    s->n = 0;
}

/* 1 when the group's (name prefix) variables are bit-identical in a and b. */
static int s_same(const s_snap_t *a, const s_snap_t *b, const char *prefix) {
    for (int i = 0; i < a->n; i++)
        if (!strncmp(a->name[i], prefix, strlen(prefix)) &&
            memcmp(a->v[i], b->v[i], a->count[i] * sizeof(float)) != 0)
            return 0;
    return 1;
}

static double s_maxdiff(const s_snap_t *a, const s_snap_t *b) {
    double worst = 0;
    for (int i = 0; i < a->n; i++)
        for (size_t k = 0; k < a->count[i]; k++) {
            double d = fabs((double)a->v[i][k] - b->v[i][k]);
            if (d > worst)
                worst = d;
        }
    return worst;
}

/* ---- training through the trainer ------------------------------------------- */

/* After every step: the trainable variables, and the GAN's monitors. */
#define S_MAX_STEPS 16
typedef struct {
    tp_model_t *m;
    int nsteps;
    s_snap_t after[S_MAX_STEPS];
    double g_loss[S_MAX_STEPS], d_loss[S_MAX_STEPS], d_acc_real[S_MAX_STEPS];
} s_rec_t;

static tp_status_t rec_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)impl;
    (void)tr;
    TP_TRY(tp_fetches_request(f, "g_loss"));
    TP_TRY(tp_fetches_request(f, "d_loss"));
    return tp_fetches_request(f, "d_accuracy_real");
}

static tp_status_t rec_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_rec_t *r = impl;
    int i = r->nsteps;
    cr_assert_lt(i, S_MAX_STEPS);
    cr_assert_eq(tp_fetches_get(f, "g_loss", &r->g_loss[i]), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_fetches_get(f, "d_loss", &r->d_loss[i]), TP_OK);
    cr_assert_eq(tp_fetches_get(f, "d_accuracy_real", &r->d_acc_real[i]), TP_OK);
    s_snap(tp_trainer_model(tr), &r->after[i]);
    r->nsteps++;
    return TP_OK;
}

static const tp_callback_ops_t s_rec_ops = {
    .name = "Recorder", .before_run = rec_before_run, .after_run = rec_after_run,
};

static void s_rec_free(s_rec_t *r) {
    for (int i = 0; i < r->nsteps; i++)
        s_snap_free(&r->after[i]);
}

/* The configuration most tests start from: the defaults, `batch` rows a
 * step, the noise into the model's noise input. */
static void s_gan_config(tp_gan_config_t *gc, int64_t batch) {
    tp_gan_config_init(gc);
    gc->batch = batch;
    gc->noise_input = S_NOISE_INPUT;
}

/* Train `steps` steps (one epoch) of a fresh model; rec (may be NULL)
 * records each step; the trained variables into out. */
static void s_train(const tp_gan_config_t *gc, int towers, int64_t batch, tp_optimizer_fn opt,
                    int steps, s_rec_t *rec, s_snap_t *out) {
    tp_model_t *m = s_model(towers, batch, opt);
    tp_trainer_t *tr = tp_gan_trainer_new(m, tp_input_feed(s_points((int)batch)), gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    if (rec) {
        tp_callback_t *cb = tp_callback_new(&s_rec_ops, rec, 0);
        cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    }
    tp_schedule_t sched = {1, 1, steps};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    s_snap(tp_trainer_model(tr), out);
    tp_trainer_destroy(&tr);
}

/* ---- the same updates by hand ------------------------------------------------- */

typedef struct {
    tp_model_t *m;
    tp_dataflow_t *df;
    tp_gan_config_t gc;
    tp_datapoint_t *dp;
    float noise[64 * ZDIM];
    tp_tensor_t feeds[4];
} s_hand_t;

static void s_hand_init(s_hand_t *h, const tp_gan_config_t *gc, tp_optimizer_fn opt) {
    memset(h, 0, sizeof *h);
    h->gc = *gc;
    h->m = s_model(1, gc->batch, opt);
    h->df = s_points((int)gc->batch);
    cr_assert_eq(tp_dataflow_reset_state(h->df, gc->seed, 0), TP_OK);
}

/* Step `step`'s batch and noise as the feeds. */
static void s_hand_batch(s_hand_t *h, int64_t step) {
    tp_datapoint_destroy(&h->dp);
    cr_assert_eq(tp_dataflow_next(h->df, &h->dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_views(h->dp, h->feeds, 3);
    tp_gan_noise_fill(&h->gc, step, 0, h->gc.batch, ZDIM, h->noise);
    int64_t zs[2] = {h->gc.batch, ZDIM};
    tp_tensor_init_wrap(&h->feeds[3], TP_FLOAT32, 2, zs, h->noise, NULL, NULL);
}

/* A run of `stages` (gradients, reduce: no optimizer involved). */
static void s_hand_run(s_hand_t *h, unsigned stages, const char *cost) {
    tp_run_opts_t ro = {.stages = stages, .cost = cost};
    int fwd = (stages & TP_RUN_FORWARD) != 0;
    cr_assert_eq(tp_model_run(h->m, 0, fwd ? h->feeds : NULL, fwd ? 4 : 0, NULL, 0, &ro),
                 TP_OK, "%s", tp_last_error());
}

/* One group's update (stages: TP_RUN_TRAIN or TP_RUN_UPDATE): the optimizer
 * at that group's update count. */
static void s_hand_stages(s_hand_t *h, unsigned stages, const char *cost, int64_t count,
                          tp_optimizer_fn opt) {
    tp_optimizer_t *mo = tp_model_optimizer(h->m);
    tp_optimizer_t *o = opt(NULL);
    double lr;
    tp_optimizer_get(o, "learning_rate", &lr);
    tp_optimizer_set(mo, "learning_rate", lr);
    tp_optimizer_destroy(&o);
    tp_optimizer_set_step(mo, count);
    s_hand_run(h, stages, cost);
}

static void s_hand_update(s_hand_t *h, const char *cost, int64_t count, tp_optimizer_fn opt) {
    s_hand_stages(h, TP_RUN_TRAIN, cost, count, opt);
}

static void s_hand_fini(s_hand_t *h) {
    tp_datapoint_destroy(&h->dp);
    tp_dataflow_destroy(&h->df);
    tp_model_destroy(&h->m);
}

/* ---- tests -------------------------------------------------------------------- */

/* GANTrainer's step, as tensorpack's graph runs it: one forward pass and
 * both players' gradients from it at the step's weights (the
 * discriminator's on the fakes of the generator before its update), then
 * the generator's update, then the discriminator's, on the step's batch
 * and noise, each group with its own Adam (own learning rate, own update
 * count): the same numbers, bit for bit, as those runs by hand. Updating
 * the generator first and then taking the discriminator's gradient on the
 * new fakes (PyTorch's usual loop) gives other numbers, and so does the
 * other order. */
Test(trainer_gan, gan_trainer_is_tensorpacks_step_bitwise) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 16);
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    const int steps = 4;
    s_snap_t trained, byhand[3];
    s_train(&gc, 1, gc.batch, s_adam, steps, NULL, &trained);

    for (int way = 0; way < 3; way++) {
        s_hand_t h;
        s_hand_init(&h, &gc, s_adam);
        for (int64_t s = 0; s < steps; s++) {
            s_hand_batch(&h, s);
            if (way == 0) {  /* tensorpack's: one forward, both backwards */
                s_hand_run(&h, TP_RUN_GRADIENTS, "g_loss");
                s_hand_run(&h, TP_RUN_BACKWARD, "d_loss");
                s_hand_stages(&h, TP_RUN_UPDATE, "g_loss", s, s_adam);
                s_hand_stages(&h, TP_RUN_UPDATE, "d_loss", s, s_adam_d);
            } else if (way == 1) {  /* g, then d on the new fakes */
                s_hand_update(&h, "g_loss", s, s_adam);
                s_hand_update(&h, "d_loss", s, s_adam_d);
            } else {  /* d, then g against the new discriminator */
                s_hand_update(&h, "d_loss", s, s_adam_d);
                s_hand_update(&h, "g_loss", s, s_adam);
            }
        }
        s_snap(h.m, &byhand[way]);
        s_hand_fini(&h);
    }
    cr_assert(s_same(&trained, &byhand[0], ""), "the trainer's step is not tensorpack's "
              "(max diff %g)", s_maxdiff(&trained, &byhand[0]));
    cr_assert(!s_same(&trained, &byhand[1], "discrim/"), "the discriminator saw the new fakes");
    cr_assert(!s_same(&trained, &byhand[2], "gen/"), "d then g gives the same generator");
    s_snap_free(&trained);
    for (int way = 0; way < 3; way++)
        s_snap_free(&byhand[way]);
}

/* The model keeps a named cost's gradients through another named cost's
 * backward over other variables, for one update each: a second update of
 * the held cost, or of the applied one, is refused (gradients are used
 * once); a reduce between the two backward passes ends the holding (a
 * second reduce would sum them twice). A backward-only run needs the
 * forward it differentiates: after an update (the variables moved under
 * the activations) it is refused until the next forward. */
Test(trainer_gan, held_gradients_are_used_once) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    s_hand_t h;
    s_hand_init(&h, &gc, s_sgd);
    s_hand_batch(&h, 0);
    s_hand_run(&h, TP_RUN_GRADIENTS, "g_loss");
    s_hand_run(&h, TP_RUN_BACKWARD, "d_loss");
    tp_run_opts_t ug = {.stages = TP_RUN_UPDATE, .cost = "g_loss"};
    tp_run_opts_t ud = {.stages = TP_RUN_UPDATE, .cost = "d_loss"};
    tp_run_opts_t bd = {.stages = TP_RUN_BACKWARD, .cost = "d_loss"};
    cr_assert_eq(tp_model_run(h.m, 0, NULL, 0, NULL, 0, &ug), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(h.m, 0, NULL, 0, NULL, 0, &ug), TP_ERR_STATE);
    cr_assert_eq(tp_model_run(h.m, 0, NULL, 0, NULL, 0, &bd), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "holds no forward"), "%s", tp_last_error());
    cr_assert_eq(tp_model_run(h.m, 0, NULL, 0, NULL, 0, &ud), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(h.m, 0, NULL, 0, NULL, 0, &ud), TP_ERR_STATE);
    s_hand_run(&h, TP_RUN_FORWARD, NULL);
    s_hand_run(&h, TP_RUN_BACKWARD, "d_loss");
    s_hand_fini(&h);

    tp_model_t *m = s_model(2, 8, s_sgd);
    s_hand_init(&h, &gc, s_sgd);
    s_hand_batch(&h, 0);
    tp_tensor_t feeds[8];
    memcpy(feeds, h.feeds, sizeof h.feeds);
    memcpy(feeds + 4, h.feeds, sizeof h.feeds);
    tp_run_opts_t gg = {.stages = TP_RUN_GRADIENTS, .cost = "g_loss"};
    tp_run_opts_t gd = {.stages = TP_RUN_GRADIENTS, .cost = "d_loss"};
    tp_run_opts_t red = {.stages = TP_RUN_REDUCE};
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, feeds, 8, NULL, 0, &gg), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &red), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, feeds, 8, NULL, 0, &gd), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &ug), TP_ERR_STATE);
    tp_model_destroy(&m);
    s_hand_fini(&h);
}

/* Each update moves its own group only: after a generator update the
 * discriminator's variables are bit-identical, and the other way round. */
Test(trainer_gan, updates_touch_their_own_group) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 16);
    s_hand_t h;
    s_hand_init(&h, &gc, s_adam);
    s_snap_t s0, s1, s2;
    s_hand_batch(&h, 0);
    s_snap(h.m, &s0);
    s_hand_update(&h, "g_loss", 0, s_adam);
    s_snap(h.m, &s1);
    s_hand_update(&h, "d_loss", 0, s_adam);
    s_snap(h.m, &s2);
    cr_assert(!s_same(&s0, &s1, "gen/"), "the generator update moved nothing");
    cr_assert(s_same(&s0, &s1, "discrim/"), "the generator update moved the discriminator");
    cr_assert(!s_same(&s1, &s2, "discrim/"), "the discriminator update moved nothing");
    cr_assert(s_same(&s1, &s2, "gen/"), "the discriminator update moved the generator");
    s_snap_free(&s0);
    s_snap_free(&s1);
    s_snap_free(&s2);
    s_hand_fini(&h);
}

/* SeparateGANTrainer: at global step s a discriminator update when
 * s % d_period == 0, a generator update when s % g_period == 0. */
static void s_check_periods(int d_period, int g_period) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.d_period = d_period;
    gc.g_period = g_period;
    const int steps = 7;
    s_rec_t rec = {0};
    s_snap_t start, end;
    tp_model_t *m0 = s_model(1, gc.batch, s_sgd);
    s_snap(m0, &start);
    tp_model_destroy(&m0);
    s_train(&gc, 1, gc.batch, s_sgd, steps, &rec, &end);
    cr_assert_eq(rec.nsteps, steps);
    int gs = 0, ds = 0;
    for (int s = 0; s < steps; s++) {
        const s_snap_t *before = s ? &rec.after[s - 1] : &start;
        int g_moved = !s_same(before, &rec.after[s], "gen/");
        int d_moved = !s_same(before, &rec.after[s], "discrim/");
        cr_assert_eq(g_moved, s % g_period == 0, "d_period %d g_period %d step %d: "
                     "generator moved %d", d_period, g_period, s, g_moved);
        cr_assert_eq(d_moved, s % d_period == 0, "d_period %d g_period %d step %d: "
                     "discriminator moved %d", d_period, g_period, s, d_moved);
        gs += g_moved;
        ds += d_moved;
    }
    cr_assert_eq(gs, tp_gan_g_updates(&gc, steps));
    cr_assert_eq(ds, tp_gan_d_updates(&gc, steps));
    s_rec_free(&rec);
    s_snap_free(&start);
    s_snap_free(&end);
}

Test(trainer_gan, separate_periods) {
    s_check_periods(1, 3);
    s_check_periods(3, 1);
    s_check_periods(1, 1);
}

/* SeparateGANTrainer runs the discriminator first (tensorpack's run_step):
 * with both due, the numbers of d then g by hand. */
Test(trainer_gan, separate_is_d_then_g_bitwise) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 16);
    gc.d_period = 1;
    gc.g_period = 2;
    gc.noise = TP_GAN_NOISE_NORMAL;
    const int steps = 5;
    s_snap_t trained, byhand;
    s_train(&gc, 1, gc.batch, s_adam, steps, NULL, &trained);
    s_hand_t h;
    s_hand_init(&h, &gc, s_adam);
    for (int64_t s = 0; s < steps; s++) {
        s_hand_batch(&h, s);
        s_hand_update(&h, "d_loss", tp_gan_d_updates(&gc, s), s_adam);
        if (s % 2 == 0)
            s_hand_update(&h, "g_loss", tp_gan_g_updates(&gc, s), s_adam);
    }
    s_snap(h.m, &byhand);
    s_hand_fini(&h);
    cr_assert(s_same(&trained, &byhand, ""), "max diff %g", s_maxdiff(&trained, &byhand));
    s_snap_free(&trained);
    s_snap_free(&byhand);
}

/* Two towers of 8 update as one tower of 16 on the two batches one after
 * the other (each tower its own rows of the step's noise; the gradients,
 * and so the losses, averaged over the towers), for both trainers. */
Test(trainer_gan, two_towers_update_as_one_on_the_whole_batch) {
    for (int sep = 0; sep < 2; sep++) {
        tp_gan_config_t gc;
        tp_gan_config_init(&gc);
        gc.noise_input = S_NOISE_INPUT;
        if (sep) {
            gc.d_period = 1;
            gc.g_period = 2;
        }
        s_rec_t r1 = {0}, r2 = {0};
        s_snap_t one, two;
        gc.batch = 16;
        s_train(&gc, 1, 16, s_sgd, 4, &r1, &one);
        gc.batch = 8;
        s_train(&gc, 2, 8, s_sgd, 4, &r2, &two);
        double d = s_maxdiff(&one, &two);
        cr_assert_lt(d, 1e-5, "trainer %d: two towers differ from one by %g", sep, d);
        cr_assert_gt(s_maxdiff(&r1.after[0], &one), 1e-3, "nothing trained");
        for (int s = 0; s < 4; s++) {
            cr_assert_lt(fabs(r1.g_loss[s] - r2.g_loss[s]), 1e-5, "step %d g_loss %g vs %g",
                         s, r1.g_loss[s], r2.g_loss[s]);
            cr_assert_lt(fabs(r1.d_loss[s] - r2.d_loss[s]), 1e-5);
            cr_assert_lt(fabs(r1.d_acc_real[s] - r2.d_acc_real[s]), 1e-6);
        }
        s_rec_free(&r1);
        s_rec_free(&r2);
        s_snap_free(&one);
        s_snap_free(&two);
    }
}

/* ---- batch norm: the zoo's DCGAN ------------------------------------------------ */

#define S_DC_B 8
#define S_DC_PIX (28 * 28)

/* The DCGAN's batches: (image uint8 [28, 28], label) datapoints of random
 * pixels, one batch of S_DC_B; its pixels into pix [S_DC_B x 784]. */
static tp_dataflow_t *s_dc_images(uint8_t *pix) {
    tp_datapoint_t *dps[S_DC_B];
    tp_rng_t r;
    tp_rng_init(&r, 5, 0);
    for (int i = 0; i < S_DC_B; i++) {
        int64_t hw[2] = {28, 28};
        dps[i] = tp_datapoint_new(2);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_UINT8, 2, hw);
        uint8_t *p = tp_datapoint_get(dps[i], 0)->data;
        for (int k = 0; k < S_DC_PIX; k++)
            p[k] = pix[i * S_DC_PIX + k] = (uint8_t)(tp_rng_u64(&r) & 0xff);
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = 0;
    }
    return tp_df_batch(tp_df_from_list(dps, S_DC_B, 0), S_DC_B, 0);
}

/* The zoo's DCGAN at batch S_DC_B, one thread (oneDNN's convolutions). */
static tp_model_t *s_dc_model(void) {
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    cr_assert_not_null(gz);
    tp_model_desc_t d = {gz->inputs, gz->ninputs, gz->build, s_adam, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = S_DC_B;
    mc.seed = 7;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&d, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

/* Every variable (ema 1: the moving averages, "/EMA"; 0: the others) of
 * m, one after another, into a new buffer; *n its floats. */
static float *s_dc_vars(tp_model_t *m, int ema, size_t *n) {
    float *out = NULL;
    *n = 0;
    for (int i = 0; i < tp_model_var_count(m); i++) {
        const char *name = tp_model_var_name(m, i);
        size_t len = strlen(name);
        if ((len > 4 && !strcmp(name + len - 4, "/EMA")) != ema)
            continue;
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, name, &v), TP_OK);
        size_t k = tp_tensor_numel(&v);
        out = realloc(out, (*n + k) * sizeof(float));
        memcpy(out + *n, v.data, k * sizeof(float));
        *n += k;
    }
    cr_assert_gt(*n, 0);
    return out;
}

/* One group's update by hand: its optimizer's learning rate, count 0. */
static void s_dc_update(tp_model_t *m, const char *cost, tp_optimizer_fn opt) {
    tp_optimizer_t *o = opt(NULL);
    double lr;
    tp_optimizer_get(o, "learning_rate", &lr);
    tp_optimizer_destroy(&o);
    tp_optimizer_set(tp_model_optimizer(m), "learning_rate", lr);
    tp_optimizer_set_step(tp_model_optimizer(m), 0);
    tp_run_opts_t u = {.stages = TP_RUN_UPDATE, .cost = cost};
    cr_assert_eq(tp_model_run(m, 0, NULL, 0, NULL, 0, &u), TP_OK, "%s", tp_last_error());
}

/* A GANTrainer step makes one forward pass, as tensorpack's graph: the
 * zoo's DCGAN (batch norm in both players, oneDNN's convolutions) after
 * one trainer step has the moving averages of one forward pass, bit for
 * bit (the generator's, which SampleGrid and tp-generate read, moved
 * once; two passes, the step this replaced, leave others), and the
 * weights of the two-pass step by hand: the discriminator's gradients
 * from the held forward are those of a fresh one. */
Test(trainer_gan, one_forward_a_step_moves_batch_norm_once) {
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    cr_assert_not_null(gz);
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.batch = S_DC_B;
    gc.noise_input = gz->noise_input;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    static uint8_t pix[S_DC_B * S_DC_PIX];
    tp_trainer_t *tr = tp_gan_trainer_new(s_dc_model(), tp_input_feed(s_dc_images(pix)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    tp_schedule_t one = {1, 1, 1};
    cr_assert_eq(tp_trainer_train(tr, &one), TP_OK, "%s", tp_last_error());
    size_t nw, ne;
    float *w = s_dc_vars(tp_trainer_model(tr), 0, &nw);
    float *ema = s_dc_vars(tp_trainer_model(tr), 1, &ne);
    tp_trainer_destroy(&tr);

    /* the step's feeds by hand: the batch, label 0, the noise of step 0 */
    static float z[S_DC_B * TP_ZOO_DCGAN_Z];
    int32_t label[S_DC_B] = {0};
    tp_gan_noise_fill(&gc, 0, 0, S_DC_B, TP_ZOO_DCGAN_Z, z);
    tp_tensor_t feeds[3];
    int64_t ish[3] = {S_DC_B, 28, 28}, lsh[1] = {S_DC_B}, zsh[2] = {S_DC_B, TP_ZOO_DCGAN_Z};
    tp_tensor_init_wrap(&feeds[0], TP_UINT8, 3, ish, pix, NULL, NULL);
    tp_tensor_init_wrap(&feeds[1], TP_INT32, 1, lsh, label, NULL, NULL);
    tp_tensor_init_wrap(&feeds[2 == gz->noise_input ? 2 : 0], TP_FLOAT32, 2, zsh, z, NULL, NULL);
    cr_assert_eq(gz->noise_input, 2);

    /* one forward pass: the moving averages */
    tp_model_t *m = s_dc_model();
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, 0, feeds, 3, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
    size_t n1;
    float *ema1 = s_dc_vars(m, 1, &n1);
    tp_model_destroy(&m);
    cr_assert_eq(n1, ne);
    cr_assert(!memcmp(ema, ema1, ne * sizeof(float)),
              "the moving averages are not those of one forward pass");

    /* the two-pass step: a fresh forward for the discriminator's gradients */
    m = s_dc_model();
    tp_run_opts_t gg = {.stages = TP_RUN_GRADIENTS, .cost = "g_loss"};
    tp_run_opts_t gd = {.stages = TP_RUN_GRADIENTS, .cost = "d_loss"};
    tp_run_opts_t red = {.stages = TP_RUN_REDUCE};
    cr_assert_eq(tp_model_run(m, 0, feeds, 3, NULL, 0, &gg), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, 0, feeds, 3, NULL, 0, &gd), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, 0, NULL, 0, NULL, 0, &red), TP_OK, "%s", tp_last_error());
    s_dc_update(m, "g_loss", s_adam);
    s_dc_update(m, "d_loss", s_adam_d);
    size_t n2, n3;
    float *w2 = s_dc_vars(m, 0, &n2), *ema2 = s_dc_vars(m, 1, &n3);
    tp_model_destroy(&m);
    cr_assert_eq(n2, nw);
    double worst = 0;
    for (size_t k = 0; k < nw; k++)
        worst = fmax(worst, fabs((double)w[k] - w2[k]));
    cr_assert(!memcmp(w, w2, nw * sizeof(float)), "the held forward's gradients are not a "
              "fresh forward's: the weights differ by up to %g", worst);
    cr_assert(memcmp(ema, ema2, ne * sizeof(float)) != 0, "two passes moved the moving "
              "averages as one does: the check above tells nothing");
    free(w);
    free(ema);
    free(ema1);
    free(w2);
    free(ema2);
}

/* ---- a backward-only run over convolutions ------------------------------------- */

/* Two costs over one grouped convolution (4 input channels a group: on
 * oneDNN its backward-data is im2col's, in the op's workspace beside what
 * the forward kept for the filter's pass): cost "b" over a scale before
 * it (the convolution's data gradient only), cost "a" over its filter
 * (the filter gradient only). */
static const tp_input_desc_t s_conv_inputs[] = {{"x", TP_FLOAT32, 4, {-1, 16, 8, 8}}};

static tp_status_t s_conv_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    int64_t ss[3] = {16, 8, 8}, ws[4] = {16, 4, 3, 3};
    tp_node_t *s = tp_variable(t, "b/s", 3, ss, (tp_init_t){TP_INIT_UNIFORM, 1}, TP_VAR_TRAINABLE);
    tp_node_t *w = tp_variable(t, "a/W", 4, ws, (tp_init_t){TP_INIT_NORMAL, 0.2f},
                               TP_VAR_TRAINABLE);
    tp_node_t *y = tp_conv2d_ex(t, NULL, tp_mul(t, NULL, in[0], s), w, NULL, 1, 1, 1, 4);
    tp_node_t *c = tp_reduce_mean(t, "c", tp_mul(t, NULL, y, y), 0, NULL, 0);
    TP_TRY(tp_tower_status(t));
    TP_TRY(tp_tower_add_cost(t, "b", c, "b/*"));
    return tp_tower_add_cost(t, "a", c, "a/*");
}

/* A backward-only run reads what its forward left, whatever a backward
 * of another cost over the same forward did first: the filter's gradient
 * after the data's is that of a fresh forward, bit for bit. */
Test(trainer_gan, a_second_backward_over_one_forward_is_a_fresh_forwards) {
    tp_model_desc_t d = {s_conv_inputs, 1, s_conv_tower, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 4;
    mc.seed = 3;
    mc.threads = 1;
    static float x[4 * 16 * 8 * 8];
    tp_rng_t r;
    tp_rng_init(&r, 9, 0);
    for (size_t i = 0; i < sizeof x / sizeof *x; i++)
        x[i] = (float)tp_rng_normal(&r);
    int64_t xs[4] = {4, 16, 8, 8};
    tp_tensor_t feed;
    tp_tensor_init_wrap(&feed, TP_FLOAT32, 4, xs, x, NULL, NULL);
    float g[2][16 * 4 * 3 * 3];
    for (int way = 0; way < 2; way++) {
        tp_model_t *m = tp_model_new(&d, &mc);
        cr_assert_not_null(m, "%s", tp_last_error());
        tp_run_opts_t gb = {.stages = TP_RUN_GRADIENTS, .cost = "b"};
        tp_run_opts_t ga = {.stages = way ? TP_RUN_BACKWARD : TP_RUN_GRADIENTS, .cost = "a"};
        if (way)
            cr_assert_eq(tp_model_run(m, 0, &feed, 1, NULL, 0, &gb), TP_OK, "%s",
                         tp_last_error());
        cr_assert_eq(tp_model_run(m, 0, way ? NULL : &feed, way ? 0 : 1, NULL, 0, &ga), TP_OK,
                     "%s", tp_last_error());
        tp_tensor_t v;
        cr_assert_eq(tp_model_grad(m, 0, "a/W", &v), TP_OK, "%s", tp_last_error());
        cr_assert_eq(v.nbytes, sizeof g[way]);
        memcpy(g[way], v.data, sizeof g[way]);
        tp_model_destroy(&m);
    }
    double worst = 0;
    for (size_t k = 0; k < sizeof g[0] / sizeof g[0][0]; k++)
        worst = fmax(worst, fabs((double)g[0][k] - g[1][k]));
    cr_assert(!memcmp(g[0], g[1], sizeof g[0]), "the filter's gradient after the data's "
              "differs from a fresh forward's by up to %g", worst);
}

/* Stopped after an epoch (a checkpoint), resumed by a new process's worth of
 * objects: the same variables, bit for bit, as the unbroken run (the batches
 * replayed by the input, the noise by the global step, each group's Adam
 * count by the global step). */
Test(trainer_gan, resume_is_bit_identical) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.d_period = 1;
    gc.g_period = 2;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    char path[] = "/tmp/tp-gan-resume-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);

    s_snap_t unbroken, resumed;
    tp_model_t *m = s_model(2, gc.batch, s_adam);
    tp_trainer_t *tr = tp_gan_trainer_new(m, tp_input_feed(s_points(8)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    tp_schedule_t all = {1, 2, 3};
    cr_assert_eq(tp_trainer_train(tr, &all), TP_OK, "%s", tp_last_error());
    s_snap(tp_trainer_model(tr), &unbroken);
    tp_trainer_destroy(&tr);

    m = s_model(2, gc.batch, s_adam);
    tr = tp_gan_trainer_new(m, tp_input_feed(s_points(8)), &gc);
    tp_schedule_t first = {1, 1, 3};
    cr_assert_eq(tp_trainer_train(tr, &first), TP_OK, "%s", tp_last_error());
    tp_train_state_t st = {.epoch = 1, .global_step = tp_trainer_global_step(tr)};
    cr_assert_eq(st.global_step, 3);
    cr_assert_eq(tp_checkpoint_save(tp_trainer_model(tr), path, &st), TP_OK, "%s", tp_last_error());
    tp_trainer_destroy(&tr);

    m = s_model(2, gc.batch, s_adam);
    cr_assert_eq(tp_checkpoint_load(m, path, TP_LOAD_STRICT, &st), TP_OK, "%s", tp_last_error());
    tr = tp_gan_trainer_new(m, tp_input_feed(s_points(8)), &gc);
    tp_trainer_set_global_step(tr, st.global_step);
    tp_schedule_t rest = {2, 2, 3};
    cr_assert_eq(tp_trainer_train(tr, &rest), TP_OK, "%s", tp_last_error());
    s_snap(tp_trainer_model(tr), &resumed);
    tp_trainer_destroy(&tr);
    unlink(path);
    cr_assert(s_same(&unbroken, &resumed, ""), "max diff %g", s_maxdiff(&unbroken, &resumed));
    s_snap_free(&unbroken);
    s_snap_free(&resumed);
}

/* The noise: a function of (seed, step, row), uniform in (-scale, scale) or
 * normal; steps and seeds differ. */
Test(trainer_gan, noise_is_seeded_per_step_and_row) {
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.noise_scale = 0.5f;
    float a[16 * ZDIM], b[8 * ZDIM], c[16 * ZDIM];
    tp_gan_noise_fill(&gc, 3, 0, 16, ZDIM, a);
    tp_gan_noise_fill(&gc, 3, 8, 8, ZDIM, b);
    cr_assert(!memcmp(a + 8 * ZDIM, b, sizeof b), "row 8 of a step depends on the split");
    for (int i = 0; i < 16 * ZDIM; i++)
        cr_assert(a[i] > -0.5f && a[i] < 0.5f);
    tp_gan_noise_fill(&gc, 4, 0, 16, ZDIM, c);
    cr_assert(memcmp(a, c, sizeof a), "two steps, one noise");
    gc.seed = 2;
    tp_gan_noise_fill(&gc, 3, 0, 16, ZDIM, c);
    cr_assert(memcmp(a, c, sizeof a), "two seeds, one noise");
    gc.noise = TP_GAN_NOISE_NORMAL;
    gc.noise_scale = 1;
    float n[4096];
    tp_gan_noise_fill(&gc, 0, 0, 1024, 4, n);
    double m = 0, v = 0;
    for (int i = 0; i < 4096; i++)
        m += n[i];
    m /= 4096;
    for (int i = 0; i < 4096; i++)
        v += (n[i] - m) * (n[i] - m);
    v /= 4096;
    cr_assert_lt(fabs(m), 0.06);
    cr_assert_lt(fabs(v - 1), 0.08);
}

/* The noise is drawn by each tower's backend into the tower's own noise
 * input (tp_model_fill_noise), not fed from a host buffer of the
 * trainer's: after a step, tower i's z is the model's planned buffer and
 * holds rows i x batch ... of the step's noise, tp_gan_noise_fill's to the
 * bit. The call itself: uniform and normal, a row offset, step -1 (a draw
 * outside training), and what it refuses. */
Test(trainer_gan, noise_is_drawn_into_each_towers_input) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.noise_scale = 0.5f;
    gc.seed = 0x1234567890abull;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    tp_model_t *m = s_model(2, gc.batch, s_adam);
    tp_trainer_t *tr = tp_gan_trainer_new(m, tp_input_feed(s_points(8)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    tp_schedule_t sched = {1, 1, 3};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    m = tp_trainer_model(tr);
    float want[8 * ZDIM];
    for (int i = 0; i < 2; i++) {
        tp_tensor_t z, again;
        cr_assert_eq(tp_model_fetch(m, i, "z", &z), TP_OK, "%s", tp_last_error());
        cr_assert_eq(z.nbytes, sizeof want);
        tp_gan_noise_fill(&gc, 2, i * 8, 8, ZDIM, want);
        cr_assert(!memcmp(z.data, want, sizeof want), "tower%d's z is not step 2's noise", i);
        cr_assert_eq(tp_model_fill_noise(m, i, S_NOISE_INPUT, gc.seed, 2, i * 8, 8, 0, 0.5f,
                                         &again),
                     TP_OK, "%s", tp_last_error());
        cr_assert_eq(again.data, z.data, "tower%d ran on a noise buffer not its own", i);
        tp_tensor_fini(&again);
        tp_tensor_fini(&z);
    }
    /* the call: the host's numbers for any step, row offset and kind */
    float got[5 * ZDIM], host[5 * ZDIM];
    for (int normal = 0; normal < 2; normal++)
        for (int64_t step = -1; step < 3; step += 2) {
            tp_tensor_t f;
            cr_assert_eq(tp_model_fill_noise(m, 1, S_NOISE_INPUT, 99, step, 11, 5, normal,
                                             normal ? 1.0f : 0.75f, &f),
                         TP_OK, "%s", tp_last_error());
            cr_assert(f.ndim == 2 && f.shape[0] == 5 && f.shape[1] == ZDIM);
            memcpy(got, f.data, sizeof got);
            tp_philox_noise_fill(99, step, 11, 5, ZDIM, normal, normal ? 1.0f : 0.75f, host);
            cr_assert(!memcmp(got, host, sizeof got), "normal %d step %lld", normal,
                      (long long)step);
            tp_tensor_fini(&f);
        }
    tp_tensor_t f;
    cr_assert_eq(tp_model_fill_noise(m, 0, S_NOISE_INPUT, 1, 0, 0, 9, 0, 1, &f), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "planned for 1..8"), "%s", tp_last_error());
    cr_assert_eq(tp_model_fill_noise(m, 0, 1, 1, 0, 0, 8, 0, 1, &f), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "'one'"), "%s", tp_last_error());
    cr_assert_eq(tp_model_fill_noise(m, 2, S_NOISE_INPUT, 1, 0, 0, 8, 0, 1, &f), TP_ERR_INVALID);
    cr_assert_eq(tp_model_fill_noise(m, 0, 4, 1, 0, 0, 8, 0, 1, &f), TP_ERR_INVALID);
    tp_trainer_destroy(&tr);
}

/* A configuration that does not fit is refused, naming what. */
Test(trainer_gan, bad_configurations_are_refused) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.d_period = 2;
    gc.g_period = 3;
    cr_assert_null(tp_gan_trainer_new(s_model(1, 8, s_sgd), tp_input_feed(s_points(8)), &gc));
    cr_assert(strstr(tp_last_error(), "one of them 1"), "%s", tp_last_error());
    tp_gan_config_init(&gc);
    gc.noise_input = S_NOISE_INPUT;
    gc.g_cost = "gen_cost";
    cr_assert_null(tp_gan_trainer_new(s_model(1, 8, s_sgd), tp_input_feed(s_points(8)), &gc));
    cr_assert(strstr(tp_last_error(), "gen_cost"), "%s", tp_last_error());
    tp_gan_config_init(&gc);
    gc.noise_input = S_NOISE_INPUT;
    gc.g_optimizer = s_adam;  /* the model's is SGD */
    cr_assert_null(tp_gan_trainer_new(s_model(1, 8, s_sgd), tp_input_feed(s_points(8)), &gc));
    cr_assert(strstr(tp_last_error(), "kinds must agree"), "%s", tp_last_error());
}

/* Hyper-parameters per group: "g/NAME", "d/NAME", or both. */
Test(trainer_gan, hyperparameters_per_group) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    tp_trainer_t *tr = tp_gan_trainer_new(s_model(1, 8, s_adam), tp_input_feed(s_points(8)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    double g, d;
    cr_assert_eq(tp_trainer_get_hyperparam(tr, "g/learning_rate", &g), TP_OK);
    cr_assert_eq(tp_trainer_get_hyperparam(tr, "d/learning_rate", &d), TP_OK);
    cr_assert_float_eq(g, 0.01, 1e-12);
    cr_assert_float_eq(d, 0.02, 1e-12);
    cr_assert_eq(tp_trainer_set_hyperparam(tr, "learning_rate", 0.005), TP_OK);
    cr_assert_eq(tp_trainer_set_hyperparam(tr, "d/beta1", 0.9), TP_OK);
    tp_trainer_get_hyperparam(tr, "d/learning_rate", &d);
    cr_assert_float_eq(d, 0.005, 1e-12);
    tp_trainer_get_hyperparam(tr, "g/beta1", &g);
    tp_trainer_get_hyperparam(tr, "d/beta1", &d);
    cr_assert_float_eq(g, 0.5, 1e-12);
    cr_assert_float_eq(d, 0.9, 1e-12);
    tp_trainer_destroy(&tr);
}

/* ---- through launch_train_with_config ---------------------------------------- */

static tp_model_desc_t s_desc = {s_inputs, 4, s_tower, s_adam, NULL};

static void s_launch_config(tp_train_config_t *c, const tp_gan_config_t *gc, const char *dir,
                            int max_epoch) {
    tp_train_config_init(c);
    c->model = &s_desc;
    c->dataflow = s_points(8);
    c->gan = gc;
    c->towers = 2;
    c->batch = 8;
    c->seed = 7;  /* the model's initial values: s_model's */
    c->threads = 1;
    c->logdir = dir;
    c->max_epoch = max_epoch;
    c->steps_per_epoch = 3;
    c->progress_names = TP_GAN_MONITORS;
    c->tensorboard = 0;
    c->curves = 0;
}

/* The launch trains a GAN as the trainer does (the same numbers, bit for
 * bit, two towers), writes the GAN's monitors to stats.json each epoch, and
 * a run stopped after an epoch and resumed from its checkpoint
 * (auto_resume) ends bit-identical to the unbroken one. */
Test(trainer_gan, launch_trains_monitors_and_resumes) {
    tp_gan_config_t gc;
    s_gan_config(&gc, 8);
    gc.seed = 7;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    char *straight = dt_new("tp-gan"), *broken = dt_new("tp-gan");
    tp_train_config_t c;
    tp_model_t *a = NULL, *b = NULL;
    s_launch_config(&c, &gc, straight, 2);
    cr_assert_eq(tp_launch_train_with_config(&c, &a), TP_OK, "%s", tp_last_error());
    s_launch_config(&c, &gc, broken, 1);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    s_launch_config(&c, &gc, broken, 2);
    c.auto_resume = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, &b), TP_OK, "%s", tp_last_error());
    s_snap_t sa, sb, direct;
    s_snap(a, &sa);
    s_snap(b, &sb);
    cr_assert(s_same(&sa, &sb, ""), "resumed differs by %g", s_maxdiff(&sa, &sb));
    /* the trainer on its own, on the same batches: the same numbers */
    tp_model_t *m = s_model(2, 8, s_adam);
    tp_trainer_t *tr = tp_gan_trainer_new(m, tp_input_feed(s_points(8)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    tp_schedule_t sched = {1, 2, 3};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    s_snap(tp_trainer_model(tr), &direct);
    tp_trainer_destroy(&tr);
    cr_assert(s_same(&sa, &direct, ""), "launch and trainer differ by %g",
              s_maxdiff(&sa, &direct));
    /* the monitors, each epoch */
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", broken);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    static const char *const names[] = {"\"g_loss\"", "\"d_loss\"", "\"d_accuracy\"",
                                        "\"d_accuracy_real\"", "\"d_accuracy_fake\"",
                                        "\"g_accuracy\""};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_assert(strstr(text, names[i]), "stats.json lacks %s: %s", names[i], text);
    s_snap_free(&sa);
    s_snap_free(&sb);
    s_snap_free(&direct);
    tp_model_destroy(&a);
    tp_model_destroy(&b);
    dt_remove(straight);
    dt_remove(broken);
}

/* Towers on several GPUs or over processes are refused for a GAN, naming why. */
Test(trainer_gan, launch_refuses_what_a_gan_cannot_do) {
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.noise_input = S_NOISE_INPUT;
    tp_train_config_t c;
    s_launch_config(&c, &gc, NULL, 1);
    c.ndevices = 2;
    c.devices[0] = 0;
    c.devices[1] = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_UNSUPPORTED);
    cr_assert(strstr(tp_last_error(), "GAN"), "%s", tp_last_error());
    s_launch_config(&c, &gc, NULL, 1);
    gc.g_cost = "no_such_cost";
    cr_assert_neq(tp_launch_train_with_config(&c, NULL), TP_OK);
    cr_assert(strstr(tp_last_error(), "no_such_cost"), "%s", tp_last_error());
}
