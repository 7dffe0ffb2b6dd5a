/* towerpack models: what the GPT's training graph (zoo_gpt.c) and its
 * one-position decoder (zoo_gpt_decode.c) share, so that both build the
 * same variables under the same names. Private to models/. */
#ifndef TOWERPACK_MODELS_ZOO_GPT_INTERNAL_H
#define TOWERPACK_MODELS_ZOO_GPT_INTERNAL_H

#include <towerpack/models.h>

/* x [B,T,K] @ scope/W [K,N] + scope/b [N] -> [B,T,N]; W drawn from
 * N(0, std^2) (GPT-2's 0.02; the projections into the residual stream
 * 0.02 / sqrt(2 L)), b zeros. NULL on an error (the tower's status says
 * which). */
tp_node_t *tp_zoo_gpt_linear_(tp_tower_t *t, const char *scope, tp_node_t *x, int64_t k,
                              int64_t n, float std);

#endif
