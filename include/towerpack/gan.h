/* towerpack: the GAN trainers (tensorpack's examples/GAN/GAN.py in C):
 * GANTrainer, SeparateGANTrainer and their data-parallel form
 * (MultiGPUGANTrainer's semantics).
 *
 * The model describes two variable groups and two costs with
 * tp_tower_add_cost (graph.h): the generator's cost over its variables
 * ("g_loss" over "gen/\*") and the discriminator's ("d_loss" over
 * "discrim/\*"). One model input may be the noise z, which the trainer
 * draws every step (seeded, a function of the seed and the global step, so
 * a resumed run replays it) instead of the dataflow, on each tower's
 * device straight into its input (tp_model_fill_noise, graph.h: nothing
 * crosses the host->device copy); the datapoints feed the other inputs,
 * in order.
 *
 *   tp_gan_config_t gc;
 *   tp_gan_config_init(&gc);
 *   gc.noise_input = 1;                    // the inputs: image, z
 *   cfg.gan = &gc;                         // tp_train_config_t (launch.h)
 *   cfg.progress_names = TP_GAN_MONITORS;  // the monitors, every epoch
 *   TP_TRY(tp_launch_train_with_config(&cfg, NULL));
 *
 * or, for a loop of your own callbacks, the trainer itself:
 * tp_gan_trainer_new(model, input, &gc), then tp_trainer_train.
 *
 * A step (docs/training.md, "Writing a GAN"):
 *   GANTrainer (d_period = g_period = 0): one forward pass at the step's
 *     weights, on its batch and noise, and both players' gradients from
 *     it (the discriminator's on the fakes of the generator before its
 *     update, as tensorpack's graph computes them), then the generator's
 *     update, then the discriminator's; batch norm's moving averages move
 *     once a step, as in tensorpack;
 *   SeparateGANTrainer (d_period, g_period >= 1, one of them 1): at global
 *     step s, a discriminator update when s % d_period == 0, then a
 *     generator update when s % g_period == 0, on the step's batch and noise;
 *   towers > 1: every tower takes its own batch and its own rows of the
 *     step's noise; each update averages the towers' gradients (the
 *     gradient of the towers' mean loss, as MultiGPUGANTrainer averages
 *     the costs).
 * The fetches callbacks ask for (the model's named outputs: TP_GAN_MONITORS)
 * are read after the step's first run (its forward pass), at the weights
 * the step started from, and averaged over the towers. */
#ifndef TOWERPACK_GAN_H
#define TOWERPACK_GAN_H

#include <stdint.h>
#include <towerpack/graph.h>
#include <towerpack/input.h>
#include <towerpack/trainer_loop.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The outputs GANModelDesc.build_losses reports, by the names a GAN's
 * tower function gives them (tp_tower_add_output): the two losses, the
 * discriminator's accuracy (its mean over real and fake) and on real and
 * fake apart, and the generator's (fakes the discriminator calls real).
 * For tp_cb_epoch_mean, tp_cb_progress_bar and tp_cb_step_writer. */
#define TP_GAN_MONITORS \
    "g_loss,d_loss,d_accuracy,d_accuracy_real,d_accuracy_fake,g_accuracy"

typedef enum {
    TP_GAN_NOISE_UNIFORM = 0, /* U(-scale, scale), as tensorpack's z */
    TP_GAN_NOISE_NORMAL = 1,  /* N(0, scale^2) */
} tp_gan_noise_t;

typedef struct tp_gan_config {
    const char *g_cost;      /* the generator's named cost ("g_loss") */
    const char *d_cost;      /* the discriminator's ("d_loss") */
    int d_period, g_period;  /* 0 and 0: GANTrainer; both >= 1, one of
                                them 1: SeparateGANTrainer */
    int64_t batch;           /* per tower, as the model was planned (the
                                noise rows of tower i start at i x batch) */
    int noise_input;         /* the model input fed the noise; -1: none
                                (the datapoints feed every input) */
    tp_gan_noise_t noise;
    float noise_scale;       /* default 1 */
    uint64_t seed;           /* the noise's (default 1); the input's too */
    /* An optimizer per group, each with its own hyper-parameters and
     * update count (Adam's bias correction). Both of the model's
     * optimizer's kind (its slots hold both groups' state). NULL: a copy
     * of the model's settings. */
    tp_optimizer_fn g_optimizer, d_optimizer;
    void *optimizer_user;
} tp_gan_config_t;

/* g_cost "g_loss", d_cost "d_loss", periods 0 (GANTrainer), batch 32,
 * noise_input -1, uniform noise of scale 1, seed 1, no optimizers. */
void tp_gan_config_init(tp_gan_config_t *cfg);

/* A GAN trainer of `model` (its towers are the data-parallel towers;
 * taken) on `input` (taken, not started: the trainer's setup starts it
 * for the model's towers with cfg->seed, skipping the batches of the
 * global steps already done, so a resumed run sees the batches and the
 * noise an unbroken one would). The model needs both named costs.
 * Hyper-parameters: "g/NAME" and "d/NAME" set one group's, "NAME" both
 * ("learning_rate", "beta1", ...); reading "NAME" gives the generator's.
 * Caller owns; NULL with tp_last_error() when the configuration does not
 * fit the model (model and input destroyed). */
tp_trainer_t *tp_gan_trainer_new(tp_model_t *model, tp_input_t *input,
                                 const tp_gan_config_t *cfg);

/* Updates of each group in global steps [0, step): what the trainer's
 * per-group update counters are at `step` (a resumed run restores them
 * from its global step). */
int64_t tp_gan_g_updates(const tp_gan_config_t *cfg, int64_t step);
int64_t tp_gan_d_updates(const tp_gan_config_t *cfg, int64_t step);

/* The noise of global step `step` for `rows` rows starting at row `row0`
 * of the step (tower i's rows start at i x batch), each of `dim` floats,
 * into out[rows x dim]: a pure function of (cfg->seed, step, row), so a
 * split of the batch over towers changes no number. */
void tp_gan_noise_fill(const tp_gan_config_t *cfg, int64_t step, int64_t row0,
                       int64_t rows, int64_t dim, float *out);

#ifdef __cplusplus
}
#endif
#endif
