/* towerpack gpu/cuda: the CUDA backend's private types, shared by the
 * module's translation units (stream.cu: the device, streams, the cuBLAS
 * product and a step's scalars, used by all the others; backend.cu: the
 * backend's table: memory, products, optimizers, collectives, staging;
 * ops.cu: the graph ops; augment.cu: augmentation). C++ only. */
#ifndef TP_GPU_CUDA_INTERNAL_H
#define TP_GPU_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"
#include <towerpack/device.h>
#include "gpu/cuda/check.h"

/* Label checks of one stream awaiting its next sync (see ops.cu). */
#define TP_CUDA_MAX_CHECKS 64

/* An op's cached cuDNN descriptors and algorithm choice (ops.cu). */
struct tp_cuda_entry;

/* One tower's stream: its CUDA stream, its own cuBLAS and cuDNN handles
 * (handles are not shared across threads), cuBLAS's workspace (given to it,
 * so cuBLAS allocates nothing in a step), and the pending label checks. */
struct tp_stream {
    cudaStream_t cu;
    cublasHandle_t blas;
    int bf16;                    /* its products on bf16 tensor cores */
    cudnnHandle_t dnn;
    void *blas_ws;
    int *checks;                 /* device: [TP_CUDA_MAX_CHECKS][2] */
    int *checks_host;            /* pinned: where a sync reads them */
    int nchecks;
    const char *check_name[TP_CUDA_MAX_CHECKS];
    int check_k[TP_CUDA_MAX_CHECKS];
    uint64_t def_seen;           /* the default stream's generation this
                                    stream was last ordered after */
    /* Whole-step graphs (backend.cu, graph_begin): while recording, calls
     * are captured, not run; while replaying, they do only their host
     * part. Scalars a step changes (the optimizers' learning rate, Adam's
     * corrections, dropout's keys) then travel through params: written to the pinned
     * host half, copied to the device half in one block by graph_end before
     * the launch, read there by the kernels. */
    int mode;                    /* TP_CUDA_EAGER, _RECORDING, _REPLAYING */
    float *params_host;          /* pinned, params_cap floats */
    float *params_dev;
    size_t params_cap, params_used; /* used: reset at graph_begin */
    /* One step ahead (the model's `ahead`): `mark` is recorded once a
     * step's inputs and scalars are on the device (graph_end records it
     * before the launch; stream_mark for a step run call by call), and
     * stream_wait_mark waits for it: the step before is then done. Each
     * step's label checks are copied at its wait into a pinned snapshot,
     * read at the next wait (or sync), when that copy is done. */
    cudaEvent_t mark;
    int *snap[2];                /* pinned [TP_CUDA_MAX_CHECKS][2] */
    int snap_n[2];               /* slots copied, 0: nothing pending */
    const char *snap_name[2][TP_CUDA_MAX_CHECKS];
    int snap_k[2][TP_CUDA_MAX_CHECKS];
    int snap_at;                 /* the snapshot the next wait fills */
};

enum { TP_CUDA_EAGER = 0, TP_CUDA_RECORDING = 1, TP_CUDA_REPLAYING = 2 };

/* The stream's next `n` params (NULL when they do not fit): host half in
 * *host, device half returned. */
float *tp_cuda_params(tp_stream_t *s, size_t n, float **host);
/* A recorded or replayed step's scalars `v[0..n)`: written to the host
 * half now, copied to the device half in one block by graph_end, before
 * the step's graph is launched. *dev: where the kernel reads them. */
tp_status_t tp_cuda_step_scalars(tp_stream_t *st, const float *v, size_t n,
                                 const float **dev);

/* A chunk of device memory handed out by bumping (the arena). */
struct tp_cuda_chunk {
    char *base;
    size_t size, used;
    int live;
    struct tp_cuda_chunk *next;
};

#define TP_CUDA_CACHE_BUCKETS 1024

typedef struct tp_cuda_backend {
    tp_backend_t base;           /* first: a tp_backend_t * is this */
    int device;
    int tf32;
    int bf16;                    /* products on bf16 tensor cores */
    int bn_cudnn;                /* batch norm's training passes by
                                    cuDNN's legacy calls, not ours
                                    (TP_CUDA_BN=cudnn) */
    int bmm_fold;                /* batch_matmul's bias and GELU folded
                                    (TP_CUDA_BMM_FOLD=1; fold.c) */
    int conv_measure;            /* rank conv algorithms by running them
                                    when planned (TP_CUDNN_SEARCH=measure) */
    char device_name[128];
    size_t chunk_bytes;
    pthread_mutex_t mu;          /* arena, cache, the default stream */
    struct tp_cuda_chunk *chunks;
    tp_stream_t *def;            /* for calls given no stream */
    /* The default stream and the towers' streams are all non-blocking, so
     * CUDA orders nothing between them: an upload on `def` would race the
     * towers' kernels that read it. Each call that leaves work on `def`
     * records def_done and bumps def_gen (under mu); a tower's stream
     * waits on def_done before its next work when it has not seen the
     * latest generation (tp_cuda_order). */
    cudaEvent_t def_done;
    uint64_t def_gen;
    cudaStream_t copy;           /* staging copies */
    struct tp_cuda_entry *cache[TP_CUDA_CACHE_BUCKETS];
} tp_cuda_backend_t;

static inline tp_cuda_backend_t *tp_cuda_of(tp_backend_t *b) {
    return (tp_cuda_backend_t *)b;
}

/* Make the backend's device current on the calling thread. */
tp_status_t tp_cuda_use(tp_cuda_backend_t *cb);
/* Row-major C = alpha op(A) op(B) + beta C on the stream's cuBLAS handle
 * (column-major C^T = op(B)^T op(A)^T: the operands swapped), in the
 * backend's math: exact fp32, TF32 (the handle's math mode) or bf16
 * tensor cores (the stream's bf16). */
cublasStatus_t tp_cuda_sgemm(tp_stream_t *st, int ta, int tb, int m, int n,
                             int k, const float *alpha, const float *a, int lda,
                             const float *b, int ldb, const float *beta,
                             float *c, int ldc);
/* The stream to run on: s, or the backend's default one. */
tp_stream_t *tp_cuda_stream(tp_cuda_backend_t *cb, tp_stream_t *s);
/* Before work on a tower's stream s: order it after all work left on the
 * default stream so far (an event wait, no host block). No-op for NULL. */
tp_status_t tp_cuda_order(tp_cuda_backend_t *cb, tp_stream_t *s);
/* After work was left on the default stream (s NULL): record def_done so
 * that the towers' streams order after it. No-op for a tower's stream. */
tp_status_t tp_cuda_def_mark(tp_cuda_backend_t *cb, tp_stream_t *s);

/* Blocks for a grid-stride loop over n elements. */
static inline unsigned tp_cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return b < 1 ? 1u : b > 65535u ? 65535u : (unsigned)b;
}

/* ops.cu */
size_t tp_cuda_op_workspace(tp_cuda_backend_t *cb, const tp_op_call_t *c);
tp_status_t tp_cuda_op_forward(tp_cuda_backend_t *cb, tp_stream_t *s,
                               const tp_op_call_t *c);
tp_status_t tp_cuda_op_backward(tp_cuda_backend_t *cb, tp_stream_t *s,
                                const tp_op_call_t *c);
void tp_cuda_cache_free(tp_cuda_backend_t *cb);
/* Read and clear the stream's pending label checks: one copy behind the
 * stream's work into pinned memory, one synchronisation. */
tp_status_t tp_cuda_checks_collect(tp_stream_t *s);
/* After the stream's work is done (a sync, or a later mark): the label
 * checks of the snapshots still pending, first failure reported. */
tp_status_t tp_cuda_snaps_read(tp_stream_t *s, int which);
/* An op's host part alone, for a replayed step (see ops.cu). */
tp_status_t tp_cuda_op_forward_host(tp_stream_t *s, const tp_op_call_t *c);

/* cast.cu */
/* tp_backend_augment_batch on the device (augment.cu). */
extern "C" tp_status_t tp_cuda_augment_batch(tp_backend_t *b, tp_stream_t *s,
                                             float *dst, int32_t *labels_dst,
                                             const uint8_t *images,
                                             const int32_t *labels,
                                             const tp_augment_pick_t *picks, int n,
                                             const tp_augment_shape_t *shape);
/* The backend's noise_fill: tp_philox_noise on the device (noise.cu). */
extern "C" tp_status_t tp_cuda_noise_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                                          uint64_t seed, int64_t step, int64_t row0,
                                          int64_t rows, int64_t dim, int normal,
                                          float scale);
extern "C" tp_status_t tp_cuda_cast_u8_f32(const uint8_t *src, float *dst,
                                           size_t n, float scale,
                                           cudaStream_t stream);

#endif
