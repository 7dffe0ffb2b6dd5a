/* towerpack gpu: the table a compute backend implements (private to gpu/).
 *
 * The graph executor never touches tensor memory itself: it plans buffers,
 * then calls the backend with tp_op_call_t records that carry every pointer
 * and shape an op needs, so a backend needs no knowledge of graphs. Both
 * backends, gpu/cpu (the reference) and gpu/cuda (a module loaded at run
 * time), fill tp_backend_ops_t; gpu/graph calls it. Moved out of the public
 * backend.h, which keeps what a user calls. Not installed. */
#ifndef TOWERPACK_GPU_BACKEND_IMPL_H
#define TOWERPACK_GPU_BACKEND_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <towerpack/backend.h>
#include <towerpack/philox.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A recorded step of one tower's stream (graph_begin/graph_end below). */
typedef struct tp_graph tp_graph_t;
/* Marks on a stream for timing the device's work (timer_new below). */
typedef struct tp_timer tp_timer_t;

/* Static parameters of an op node, fixed when the graph is built. */
typedef struct tp_op_attr {
    int kh, kw;       /* window (pool) or kernel (conv) */
    int sh, sw;       /* strides */
    int ph, pw;       /* zero (conv) or ignored (pool) padding, each side */
    float alpha;      /* leaky slope, drop rate, scale, L2 coefficient,
                         batch-norm moving-average momentum, label
                         smoothing (softmax cross-entropy) */
    float eps;        /* batch-norm epsilon */
    float beta;       /* clip: the upper bound (alpha the lower) */
    const float *data; /* constant: its values, host memory [count of the
                          output shape], owned by the graph node */
    int training;     /* 1: training semantics (batch norm, dropout) */
    int update_state; /* batch norm: update the moving averages */
    tp_dtype_t in_dtype; /* cast: the input's dtype */
    int act;          /* an activation folded into the op (gpu/graph/fold.c):
                         TP_ACT_RELU applies relu to its output, and the
                         backward masks dy by y > 0 before its own work */
    int axes;         /* the reduce family: bit i set = input axis i */
    /* the shape family (docs/ops.md) */
    int axis;                    /* concat: the axis */
    int64_t dims_a[TP_MAX_DIMS]; /* transpose: the permutation; slice:
                                    start; pad: before (per axis) */
    int64_t dims_b[TP_MAX_DIMS]; /* slice: step; pad: after */
    /* the convolution family: 0 reads as the default (1), so attributes
     * made before these fields existed keep their meaning */
    int dh, dw;       /* dilation (conv2d, conv2d_transpose) */
    int groups;       /* channel groups (conv2d, conv2d_transpose) */
    int oph, opw;     /* conv2d_transpose: output padding (bottom, right) */
    int align_corners; /* upsample_bilinear: PyTorch's align_corners */
    /* the linalg family: batch_matmul's operands stored transposed (a as
     * [...,K,M], b as [...,N,K]); layer norm's count of trailing axes, group
     * norm's groups (instance norm: C); eps above is the norms' epsilon */
    int trans_a, trans_b;
    int norm_axes;
    int norm_groups;
    /* the norms' parameters left out (elementwise_affine=False): bit 0 no
     * gamma, bit 1 no beta; the inputs are then x and the parameters
     * present, in that order (tp_norm_params). 0 (both present) is what
     * attributes made before this field meant. */
    int norm_absent;
    /* attention: 0 takes q, k and v as three inputs; H > 0 one packed
     * input [...,T,3 H D] (q, k, v side by side in each row, each H heads
     * of D) read where it lies, the output [...,T,H D] (tp_attention_qkv) */
    int heads;
} tp_op_attr_t;

#define TP_ACT_NONE 0
#define TP_ACT_RELU 1
/* batch_matmul only (fold.c, where ops->bmm_fold says yes): GELU (erf) or
 * its tanh approximation on the product (+ bias); the forward keeps the
 * pre-activation in the act's room (tp_act_room) for the backward, which
 * turns dy into the pre-activation's gradient there */
#define TP_ACT_GELU 2
#define TP_ACT_GELU_TANH 3

#define TP_OP_MAX_INPUTS 256

/* One kernel invocation. Shapes carry the step's batch size in dim 0 of
 * batched tensors. dx[i] NULL means input i needs no gradient; dx_acc[i] 1
 * means add into dx[i], 0 means overwrite it. */
typedef struct tp_op_call {
    tp_op_kind_t kind;
    const tp_op_attr_t *attr;
    const char *name;               /* the node's name, for error messages */
    int ninputs;
    const void *const *x;           /* [ninputs] input values */
    const tp_shape_t *xshape;       /* [ninputs] */
    void *y;                        /* output value */
    tp_shape_t yshape;
    float *const *dx;               /* [ninputs] input gradients or NULL */
    const int *dx_acc;              /* [ninputs] */
    const float *dy;                /* output gradient (backward only) */
    void *workspace;                /* op_workspace() bytes, kept across the
                                       forward and backward of one step */
    size_t workspace_bytes;         /* bytes at workspace as planned for this
                                       node; 0 when unknown (planning) */
    const void *node;               /* the node this call runs: a backend's
                                       per-node caches key on it (two nodes
                                       may share attr); NULL: use attr */
    float *state[2];                /* batch norm moving mean, variance */
    tp_rng_t *rng;                  /* dropout: the tower's generator */
    /* matmul: a bias add folded into it (gpu/graph/fold.c): y = x @ W +
     * bias[M], and dbias (NULL: not needed) gets the column sums of dy,
     * stored or added by dbias_acc */
    const float *bias;
    float *dbias;
    int dbias_acc;
    /* nChw16c operands (gpu/graph/fold.c's tp_plan_blk16_, only on a
     * backend whose nchw16c says yes): bit i, input i's value and dx[i];
     * TP_BLK16_Y, y and dy. 0: every operand in its plain layout. */
    unsigned blk16;
    /* batch norm: the block end folded into it (gpu/graph/fold.c's
     * tp_plan_block_end_, only on a backend whose bnorm_add says yes):
     * y = act(bn(x) + skip), skip [the output's shape, its layout], and
     * dskip (NULL: not needed) gets the masked dy, stored or added by
     * dskip_acc. NULL skip: a plain batch norm. */
    const float *skip;
    float *dskip;
    int dskip_acc;
    /* conv2d: x[0] and dx[0] are NHWC in memory ([N, H, W, C]; xshape[0]
     * still says [N, C, H, W]): a transpose NHWC -> NCHW folded into the
     * call (gpu/graph/fold.c), only where the backend's conv_nhwc says
     * it runs the call so. 0: NCHW. */
    int nhwc;
} tp_op_call_t;
#define TP_BLK16_Y (1u << 31)

/* A folded activation (attr->act) and a backend's op entries. The
 * backward masks dy into room at the start of the op's workspace (the
 * output's floats, rounded to 256 bytes); the op's own workspace follows
 * it, so an op's code sees its workspace as if nothing were folded.
 * tp_act_room is that room's size (0 without an activation); tp_act_inner
 * makes the call the op's own code runs: the workspace past the room, and
 * for the backward dy = `masked`. */
static inline size_t tp_act_room(const tp_op_call_t *c) {
    if (!c->attr || c->attr->act == TP_ACT_NONE)
        return 0;
    return (tp_shape_count(&c->yshape) * sizeof(float) + 255) & ~(size_t)255;
}
static inline tp_op_call_t tp_act_inner(const tp_op_call_t *c, const float *masked) {
    tp_op_call_t in = *c;
    size_t room = tp_act_room(c);
    /* planning asks op_workspace with no workspace yet: nothing to move */
    in.workspace = room && c->workspace ? (char *)c->workspace + room : c->workspace;
    in.workspace_bytes = c->workspace_bytes > room ? c->workspace_bytes - room : 0;
    if (masked)
        in.dy = masked;
    return in;
}

typedef enum {
    TP_COPY_H2D = 0,
    TP_COPY_D2H = 1,
    TP_COPY_D2D = 2,
} tp_copy_kind_t;

typedef struct tp_backend_ops {
    const char *name; /* "cpu", "cuda" */

    /* Device memory, aligned to TP_ALIGNMENT; NULL on failure. */
    void *(*alloc)(tp_backend_t *b, size_t bytes);
    void (*free)(tp_backend_t *b, void *ptr);
    tp_status_t (*copy)(tp_backend_t *b, tp_stream_t *s, void *dst,
                        const void *src, size_t bytes, tp_copy_kind_t kind);
    tp_status_t (*fill)(tp_backend_t *b, tp_stream_t *s, float *dst,
                        float value, size_t count);

    /* Streams order work on a device; calls on one stream run in order. */
    tp_stream_t *(*stream_new)(tp_backend_t *b);
    void (*stream_destroy)(tp_backend_t *b, tp_stream_t *s);
    tp_status_t (*stream_sync)(tp_backend_t *b, tp_stream_t *s);

    /* Scratch bytes the op needs at the planned (largest) shapes, a
     * folded activation's room included (tp_act_room). */
    size_t (*op_workspace)(tp_backend_t *b, const tp_op_call_t *call);
    tp_status_t (*op_forward)(tp_backend_t *b, tp_stream_t *s,
                              const tp_op_call_t *call);
    tp_status_t (*op_backward)(tp_backend_t *b, tp_stream_t *s,
                               const tp_op_call_t *call);

    /* Row-major C = alpha * op(A) @ op(B) + beta * C. */
    tp_status_t (*gemm)(tp_backend_t *b, tp_stream_t *s, int trans_a,
                        int trans_b, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *bm, int ldb,
                        float beta, float *c, int ldc);

    /* Optimizer updates over flat buffers of n floats. adam_update's
     * weight_decay is AdamW's decoupled decay (w *= 1 - lr * weight_decay
     * before the step); 0 is Adam, bit for bit. */
    tp_status_t (*sgd_update)(tp_backend_t *b, tp_stream_t *s, float *param,
                              const float *grad, float *momentum_buf,
                              size_t n, float lr, float momentum,
                              int nesterov);
    tp_status_t (*adam_update)(tp_backend_t *b, tp_stream_t *s, float *param,
                               const float *grad, float *m, float *v,
                               size_t n, float lr, float beta1, float beta2,
                               float eps, float weight_decay, int64_t step);

    /* Collectives. A communicator joins `nranks` participants; each calls
     * allreduce with its rank from its own thread, and every buffer ends
     * holding the sum (or mean) of all, summed in rank order. */
    tp_comm_t *(*comm_new)(tp_backend_t *b, int nranks);
    void (*comm_destroy)(tp_backend_t *b, tp_comm_t *comm);
    tp_status_t (*allreduce)(tp_backend_t *b, tp_comm_t *comm, int rank,
                             tp_stream_t *s, float *buf, size_t count,
                             int average);
    /* Wake every rank waiting in allreduce with TP_ERR_INTERRUPTED, now and
     * in later calls (a tower failed and will not contribute). */
    void (*comm_abort)(tp_backend_t *b, tp_comm_t *comm);
    /* One caller holding all buffers: bufs[0..n-1] each end with the sum
     * (or mean), or only bufs[0] when `root_only` (parameter-server style). */
    tp_status_t (*allreduce_local)(tp_backend_t *b, float *const *bufs,
                                   int n, size_t count, int average,
                                   int root_only);

    void (*destroy)(tp_backend_t *b);

    /* ---- staging (appended later: a table without these entries leaves
     * them NULL; call them through the tp_backend_stage_* helpers, which
     * then fall back to plain host memory). A stage is one batch buffer in
     * pinned host memory plus its device copy. The producer fills
     * stage_host(), waits for nothing else and calls stage_begin(), which
     * copies to the device on the backend's copy stream, overlapping the
     * compute of the step before; the consumer calls stage_wait() to order
     * its stream after that copy (no host wait), reads stage_device(), then
     * stage_release() so the next copy into this stage waits for its reads.
     * stage_host_wait() blocks the host until the last copy out of the host
     * buffer finished, before the producer refills it. The CPU backend has
     * one buffer (host == device) and no copy. */
    tp_stage_t *(*stage_new)(tp_backend_t *b, size_t bytes);
    void (*stage_destroy)(tp_backend_t *b, tp_stage_t *st);
    void *(*stage_host)(tp_backend_t *b, tp_stage_t *st);
    void *(*stage_device)(tp_backend_t *b, tp_stage_t *st);
    tp_status_t (*stage_begin)(tp_backend_t *b, tp_stage_t *st, size_t bytes);
    tp_status_t (*stage_wait)(tp_backend_t *b, tp_stage_t *st,
                              tp_stream_t *s);
    tp_status_t (*stage_release)(tp_backend_t *b, tp_stage_t *st,
                                 tp_stream_t *s);
    tp_status_t (*stage_host_wait)(tp_backend_t *b, tp_stage_t *st);

    /* ---- whole steps as graphs (appended later: NULL in a table without
     * them, and the model then runs every step call by call). The calls a
     * tower makes on its stream between graph_begin and graph_end are
     * recorded once and replayed afterwards:
     *  - graph_begin(g NULL) starts recording: nothing runs; graph_end
     *    makes *g from the record and launches it;
     *  - graph_begin(g) starts a replay: every call on the stream does only
     *    its host part (dropout's masks drawn into the same pinned place,
     *    the optimizers' scalars, the label checks' bookkeeping), in the
     *    same order as when recorded; graph_end launches *g.
     * The shapes, pointers and call sequence must be those recorded (the
     * model keys a graph by its batch); the calls must not allocate or
     * synchronise (the model records a step only after one ran call by
     * call). graph_abort leaves either state after a failed call, nothing
     * launched. */
    tp_status_t (*graph_begin)(tp_backend_t *b, tp_stream_t *s, tp_graph_t *g);
    tp_status_t (*graph_end)(tp_backend_t *b, tp_stream_t *s, tp_graph_t **g);
    void (*graph_abort)(tp_backend_t *b, tp_stream_t *s);
    void (*graph_destroy)(tp_backend_t *b, tp_graph_t *g);

    /* ---- batches made on the device (appended later; NULL: the host
     * implementation in gpu/augment.c, right for a backend whose memory is
     * host memory). As tp_backend_augment_batch (backend.h), the picks
     * already checked against nsrc and the shape. */
    tp_status_t (*augment_batch)(tp_backend_t *b, tp_stream_t *s, float *dst,
                                 int32_t *labels_dst, const uint8_t *images,
                                 const int32_t *labels,
                                 const tp_augment_pick_t *picks, int n,
                                 const tp_augment_shape_t *shape);

    /* ---- small results read back with the step's own sync (appended
     * later; NULL: read them with copy, one sync each). host_alloc gives
     * page-locked host memory, which a stream copies into asynchronously;
     * copy_async enqueues a copy on s (the pointers say which way),
     * complete at the stream's next sync; in a recorded step it is part
     * of the record, and a replay does nothing for it on the host. The
     * model mirrors a training step's scalar outputs this way (a GPU's
     * loss and metrics then cost no synchronisation of their own). */
    void *(*host_alloc)(tp_backend_t *b, size_t bytes);
    void (*host_free)(tp_backend_t *b, void *ptr);
    tp_status_t (*copy_async)(tp_backend_t *b, tp_stream_t *s, void *dst,
                              const void *src, size_t bytes);

    /* ---- one step ahead (appended later; NULL: the model synchronises
     * at the end of every step). stream_mark records the stream's mark
     * now (graph_end records it itself, once a replayed step's scalars are
     * on the device, before the launch). stream_wait_mark snapshots the
     * label checks of the work queued since the last wait (copied behind
     * it), waits on the host until the mark is reached, and reports a bad
     * label of the step before, whose snapshot is then complete. A step
     * marked after its inputs are copied in and waited for at its end thus
     * leaves the host once the step before it is done: the host queues
     * step N + 1 while step N runs. stream_sync reads every snapshot
     * still pending. */
    tp_status_t (*stream_mark)(tp_backend_t *b, tp_stream_t *s);
    tp_status_t (*stream_wait_mark)(tp_backend_t *b, tp_stream_t *s);

    /* ---- the all-reduce in buckets, beside the backward pass (appended
     * later; NULL: the model reduces the whole gradient arena with
     * allreduce once the backward pass is over). allreduce_begin reduces
     * buf[0..count) across the ranks once the work queued on s so far is
     * done, beside the work queued on s after it (a device: on a stream of
     * the communicator's; the CPU, whose ranks' threads do the sums: at
     * once). Every rank begins the same buckets in the same order.
     * allreduce_end puts s's later work after every bucket the rank began
     * and waits for them on the host: TP_OK once each rank's buffers hold
     * the sums (the means), or the failure, a peer's abort included. */
    tp_status_t (*allreduce_begin)(tp_backend_t *b, tp_comm_t *comm, int rank,
                                   tp_stream_t *s, float *buf, size_t count,
                                   int average);
    tp_status_t (*allreduce_end)(tp_backend_t *b, tp_comm_t *comm, int rank,
                                 tp_stream_t *s);

    /* ---- a communicator across processes, one rank each (appended later;
     * NULL: the backend has none, and dist/ all-reduces its host memory
     * over MPI instead). comm_id makes the id (rank 0; at most cap bytes,
     * *len set) that the launcher's channel carries to every process
     * (MPI's broadcast); comm_join makes this process's rank `rank` of
     * `nranks`. On the communicator the process is rank 0 of allreduce
     * and allreduce_begin/end, which reduce across the processes; it is
     * freed by comm_destroy, aborted by comm_abort. */
    tp_status_t (*comm_id)(tp_backend_t *b, void *id, size_t cap, size_t *len);
    tp_comm_t *(*comm_join)(tp_backend_t *b, int nranks, int rank,
                            const void *id, size_t len);

    /* ---- the device's time between marks on a stream, for profiling
     * (appended later; NULL: the model profiles the host's time only).
     * timer_new makes n marks; timer_mark records mark i on s, reached
     * once the work queued on s before it is done (the CPU, whose calls
     * end done: the host's clock now); after the stream's sync, timer_ms
     * gives the time from mark i to mark j. */
    tp_timer_t *(*timer_new)(tp_backend_t *b, int n);
    tp_status_t (*timer_mark)(tp_backend_t *b, tp_stream_t *s, tp_timer_t *t, int i);
    tp_status_t (*timer_ms)(tp_backend_t *b, tp_timer_t *t, int i, int j, float *ms);
    void (*timer_destroy)(tp_backend_t *b, tp_timer_t *t);
    /* keeps stream s busy for ns nanoseconds of the device's clock, so
     * that the work the host queues meanwhile runs back to back after it:
     * a mark after a hold times the device's work, not the host's
     * launching (NULL: calls end done, as on the CPU) */
    tp_status_t (*timer_hold)(tp_backend_t *b, tp_stream_t *s, uint64_t ns);

    /* ---- gradient processing on the device (appended later; NULL: the
     * backend cannot clip, and a model asked to says so). acc is one
     * float of device memory. grad_sumsq sets acc[0] (add 0) or adds to
     * it (add 1) the sum of g[0..n)'s squares, summed in an order fixed
     * by n alone (the same result every run); grad_clip scales g[0..n)
     * by min(1, clip / sqrt(acc[0])) (tensorpack's GlobalNormClip), read
     * on the device: neither waits for the host, and both record into a
     * step graph (replays pass no new scalars: clip is fixed). */
    tp_status_t (*grad_sumsq)(tp_backend_t *b, tp_stream_t *s, const float *g,
                              size_t n, float *acc, int add);
    tp_status_t (*grad_clip)(tp_backend_t *b, tp_stream_t *s, float *g,
                             size_t n, float clip, const float *acc);
    /* The weights' moving average after an update (NULL: none):
     * ema[i] = decay * ema[i] + (1 - decay) * w[i]; decay may change from
     * step to step (a recorded step reads it as a step scalar). */
    tp_status_t (*ema_update)(tp_backend_t *b, tp_stream_t *s, float *ema,
                              const float *w, size_t n, float decay);
    /* Gradient accumulation (NULL: none): last 0 adds g[0..n) into
     * sum[0..n); last 1 makes g[i] = (sum[i] + g[i]) * scale (the mean of
     * the steps' gradients, scale 1/K), leaving sum alone. */
    tp_status_t (*grad_accumulate)(tp_backend_t *b, tp_stream_t *s, float *sum,
                                   float *g, size_t n, int last, float scale);
    /* ---- the GAN's noise drawn on the device (appended later; NULL: drawn
     * on the host, right for a backend whose memory is host memory; call
     * it through tp_backend_noise_fill below). dst[rows x dim] (device
     * memory) gets tp_philox_noise(seed, step, row0 + r, k, normal, scale)
     * (towerpack/philox.h) for each element, the host's numbers to the
     * bit. Call by call only: not inside a recorded step. */
    tp_status_t (*noise_fill)(tp_backend_t *b, tp_stream_t *s, float *dst,
                              uint64_t seed, int64_t step, int64_t row0,
                              int64_t rows, int64_t dim, int normal, float scale);
    /* ---- the all-reduce fused with SGD (appended later; NULL: allreduce,
     * then sgd_update per slice). allreduce, and rank r also applies
     * sgd_update(param, the sum, momentum_buf, lr, momentum, nesterov) to
     * the floats it sums, [c r, min(c (r + 1), count)) with c =
     * ceil(count / nranks), block by block while the sums are in cache:
     * every buffer, param and momentum_buf end with the bits allreduce
     * then that sgd_update give, and no rank returns before every rank's
     * update is done (the others' next forward reads the weights). */
    tp_status_t (*allreduce_sgd)(tp_backend_t *b, tp_comm_t *comm, int rank,
                                 tp_stream_t *s, float *buf, size_t count,
                                 int average, float *param, float *momentum_buf,
                                 float lr, float momentum, int nesterov);
    /* ---- activations kept blocked between ops (appended later; NULL or 0:
     * never). 1: this backend runs conv2d, batch norm, add, relu, max and
     * average pooling and global average pool calls whose tp_op_call_t.blk16 marks operands
     * as nChw16c (C a multiple of
     * 16, [N, C/16, H, W, 16]), so that the graph may keep a tensor that
     * only such ops read in that layout (gpu/graph/fold.c). */
    int (*nchw16c)(tp_backend_t *b);
    /* ---- batch_matmul's folds (appended later; NULL or 0: never). 1: this
     * backend runs batch_matmul calls with a folded bias (tp_op_call_t.bias,
     * dbias: a [N] vector added to every row of y) and a folded GELU
     * (attr.act TP_ACT_GELU or TP_ACT_GELU_TANH), so that fold.c may fold
     * a GPT's linear (batch_matmul, add of a [N] variable, gelu) into one
     * call. */
    int (*bmm_fold)(tp_backend_t *b);
    /* ---- the ResNet block end in one call (appended later; NULL or 0:
     * never). 1: this backend runs batch norm calls that carry a skip
     * (tp_op_call_t.skip: the add after the batch norm, and its folded
     * relu, in the batch norm's own passes), so that fold.c may plan them. */
    int (*bnorm_add)(tp_backend_t *b);
    /* ---- NHWC input folded into conv2d (appended later; NULL: never).
     * 1: this backend runs conv2d call c with c->nhwc set (x[0] and dx[0]
     * NHWC), as planned (its shapes, attributes, which dx are wanted), so
     * that the graph may fold a transpose NHWC -> NCHW into it
     * (gpu/graph/fold.c). */
    int (*conv_nhwc)(tp_backend_t *b, const tp_op_call_t *c);
    /* ---- SGD with torch.optim.SGD's coupled weight decay in the update's
     * own pass (appended later; NULL: tp_optimizer_update_group makes it
     * from two sgd_update calls). Each of the n floats: d = g + wd w,
     * v = momentum v + d, w -= lr v (nesterov: w -= lr (d + momentum v));
     * momentum_buf NULL or momentum 0: w -= lr d. */
    tp_status_t (*sgd_wd_update)(tp_backend_t *b, tp_stream_t *s, float *param,
                                 const float *grad, float *momentum_buf, size_t n,
                                 float lr, float momentum, int nesterov,
                                 float weight_decay);
    /* allreduce_sgd with that decay (NULL: never fused with a decay):
     * decay[k] over the floats [seg[k], seg[k + 1]) of the buffer, nseg
     * segments with seg[0] = 0 and seg[nseg] = count (the model's
     * variables, each at its decay multiplier); nseg 0 is allreduce_sgd. */
    tp_status_t (*allreduce_sgd_wd)(tp_backend_t *b, tp_comm_t *comm, int rank,
                                    tp_stream_t *s, float *buf, size_t count,
                                    int average, float *param, float *momentum_buf,
                                    float lr, float momentum, int nesterov,
                                    const size_t *seg, const float *decay, int nseg);
    /* ---- the all-reduce fused with the global-norm clip and Adam/AdamW
     * (appended later; NULL: allreduce, then grad_sumsq, grad_clip and
     * adam_update per slice). Rank r sums its slice of every buffer (the
     * backend cuts [0, count) into nranks slices, in rank order) into its
     * own buffer, with the squares of the sums while they are in cache;
     * the ranks meet; each then takes the norm of all the sums, scales its
     * slice's by min(1, clip / norm) (clip <= 0: no clip) and applies
     * adam_update(param, the scaled sums, m, v, lr, beta1, beta2, eps,
     * decay[k], step) to each segment k [seg[k], seg[k + 1]) of its slice
     * (nseg 0: decay 0 everywhere). param, m and v end with the bits of
     * allreduce, grad_sumsq over the whole buffer, grad_clip, then
     * adam_update; buf holds the unscaled sums in the rank's slice only
     * (its other floats are left as they were). No rank returns before
     * every rank's update is done (the others' next forward reads the
     * weights). */
    tp_status_t (*allreduce_adam)(tp_backend_t *b, tp_comm_t *comm, int rank,
                                  tp_stream_t *s, float *buf, size_t count,
                                  int average, float *param, float *m, float *v,
                                  float lr, float beta1, float beta2, float eps,
                                  int64_t step, float clip, const size_t *seg,
                                  const float *decay, int nseg);
} tp_backend_ops_t;

struct tp_backend {
    const tp_backend_ops_t *ops;
    void *impl;  /* the backend's own state */
    int device;  /* -1 for the CPU */
};

/* The noise of tp_philox_noise_fill into dst[rows x dim] of b's memory:
 * on the device where the backend has noise_fill, else on the host. */
static inline tp_status_t tp_backend_noise_fill(tp_backend_t *b, tp_stream_t *s,
                                                float *dst, uint64_t seed,
                                                int64_t step, int64_t row0,
                                                int64_t rows, int64_t dim,
                                                int normal, float scale) {
    if (b->ops->noise_fill)
        return b->ops->noise_fill(b, s, dst, seed, step, row0, rows, dim, normal, scale);
    tp_philox_noise_fill(seed, step, row0, rows, dim, normal, scale, dst);
    return TP_OK;
}

/* Dropout's draw, shared so that both backends drop the same elements:
 * each dropout call takes one 64-bit key from the tower's generator
 * (tp_rng_u64), and element i is dropped when a 24-bit number made from
 * (key, i) alone is below tp_dropout_threshold(rate): bits 8..31 (even i)
 * or 40..63 (odd i) of SplitMix64's output mix of key + (i / 2 + 1) x the
 * golden-ratio increment, i.e. SplitMix64's stream started at the key.
 * Every element's draw is independent of the others, so a GPU thread
 * computes its own (no mask travels from the host, and a recorded step
 * only needs the key) and the generator advances by one output per call,
 * whatever the size. */
#ifdef __CUDACC__
#define TP_HOST_DEVICE __host__ __device__
#else
#define TP_HOST_DEVICE
#endif
static inline uint32_t tp_dropout_threshold(float rate) {
    return (uint32_t)((double)rate * 16777216.0);
}
static inline TP_HOST_DEVICE uint64_t tp_dropout_mix(uint64_t key, uint64_t pair) {
    uint64_t z = key + (pair + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline TP_HOST_DEVICE int tp_dropout_drops(uint64_t key, uint32_t thr,
                                                  uint64_t i) {
    uint64_t r = tp_dropout_mix(key, i >> 1);
    return ((uint32_t)(r >> ((i & 1) ? 40 : 8)) & 0xffffffu) < thr;
}

/* The rendezvous of a communicator's ranks (gpu/barrier.c), shared by both
 * backends' allreduce: reusable round after round, and abortable, because a
 * failed tower must wake the others instead of hanging them. Held by value
 * in a backend's tp_comm; exported by libtowerpack for the CUDA module. */
typedef struct tp_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nranks;
    int arrived;         /* ranks waiting in this round */
    uint64_t generation; /* rounds completed */
    int aborted;
} tp_barrier_t;

void tp_barrier_init(tp_barrier_t *b, int nranks);
void tp_barrier_fini(tp_barrier_t *b);
/* Wait until all nranks arrive: 0, or -1 once tp_barrier_abort was called
 * (then and in every later call). */
int tp_barrier_wait(tp_barrier_t *b);
/* Wake every waiter with -1, now and in later calls. */
void tp_barrier_abort(tp_barrier_t *b);
/* tp_barrier_wait inside an allreduce: TP_OK, or TP_ERR_INTERRUPTED
 * naming the rank. */
tp_status_t tp_barrier_sync(tp_barrier_t *b, int rank);
/* An allreduce's first meeting: publish this rank's count and average in
 * counts[rank] and averages[rank] ([nranks] each, the communicator's),
 * wait for all, and check that every rank brought the same. TP_OK;
 * TP_ERR_INTERRUPTED; TP_ERR_INVALID (on every rank alike) if not. */
tp_status_t tp_barrier_agree(tp_barrier_t *b, int rank, size_t *counts,
                             int *averages, size_t count, int average);

#ifdef __cplusplus
}
#endif
#endif
