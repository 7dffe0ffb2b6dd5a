/* towerpack pipeline/train: a GAN step over a model it borrows (the GAN
 * trainers' engine, pipeline/train/trainer_gan.c): tp_gan_trainer_new
 * wraps it with a model and an input of its own, and the launch
 * (pipeline/train/train.c, tp_train_config_t.gan) calls it from its
 * supervised step. Internal to pipeline/train/. */
#ifndef TP_PIPELINE_GAN_STEP_H
#define TP_PIPELINE_GAN_STEP_H

#include <towerpack/datapoint.h>
#include <towerpack/gan.h>

typedef struct tp_gan_step tp_gan_step_t;

/* The step of cfg's trainer over `model` (borrowed; it must outlive the
 * step): checks that cfg fits the model and makes the groups' optimizers.
 * Caller owns; NULL with tp_last_error() naming what does not fit. */
tp_gan_step_t *tp_gan_step_new(tp_model_t *model, const tp_gan_config_t *cfg);
void tp_gan_step_destroy(tp_gan_step_t **self_p);

/* Global step `step` on batches[i] (tower i's, borrowed: the caller gives
 * them back after): the noise, the updates, the fetches f asks for (f may
 * be NULL). */
tp_status_t tp_gan_step_run(tp_gan_step_t *self, tp_datapoint_t *const *batches,
                            int64_t step, tp_fetches_t *f);

/* Hyper-parameters per group: "g/NAME", "d/NAME", "NAME" (both; reading:
 * the generator's). */
tp_status_t tp_gan_step_set_hparam(tp_gan_step_t *self, const char *name, double v);
tp_status_t tp_gan_step_get_hparam(const tp_gan_step_t *self, const char *name,
                                   double *v);

#endif
