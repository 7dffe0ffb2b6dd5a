/* towerpack: the model's calls that only training across processes uses
 * (dist/: tensorpack's HorovodTrainer). <towerpack/dist.h> includes this
 * header; a first program needs none of it. It sits apart from graph.h so
 * that graph.h is the model as one process uses it, and belongs to gpu/
 * (the model's room) because gpu/ implements it and may not include
 * dist.h. */
#ifndef TOWERPACK_GRAPH_DIST_H
#define TOWERPACK_GRAPH_DIST_H

#include <stddef.h>
#include <towerpack/graph.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Data-parallel over processes on devices (dist/ does this for a GPU
 * model under MPI): rank 0 makes a communicator id (at most
 * TP_COMM_ID_MAX bytes), the launcher carries it to every process, and each
 * joins as rank `rank` of `nranks`; tp_model_allreduce_ranks then makes
 * tower 0's gradients their mean over the processes (NCCL on a GPU), on
 * the device, with no host copy. TP_ERR_UNSUPPORTED on a backend without
 * such communicators (the CPU: dist/ all-reduces host memory over MPI
 * itself) or a model on several devices. The communicator is the model's:
 * freed with it. */
#define TP_COMM_ID_MAX 256
tp_status_t tp_model_comm_id(tp_model_t *m, void *id, size_t *len);
tp_status_t tp_model_comm_join(tp_model_t *m, int nranks, int rank,
                               const void *id, size_t len);
tp_status_t tp_model_allreduce_ranks(tp_model_t *m);

/* The model's state as the flat buffers it lives in, for code that moves a
 * whole model between processes (distributed training broadcasts rank 0's
 * and all-reduces the gradients in place). The buffers belong to the model;
 * they are host memory only on the CPU backend (tp_backend_device < 0). */
typedef struct tp_model_arenas {
    float *train;         /* [ntrain] trainable variables (padded layout) */
    size_t ntrain;
    float *model;         /* [nmodel] model-only variables (BN statistics) */
    size_t nmodel;
    float *slots[2];      /* [nslots][ntrain] the optimizer's state */
    int nslots;
    float *grads;         /* [ntrain] tower 0's gradients, trainable layout */
    int ntowers;          /* training towers (tp_model_tower_rng's range) */
} tp_model_arenas_t;
void tp_model_arenas(tp_model_t *m, tp_model_arenas_t *out);

#ifdef __cplusplus
}
#endif
#endif
