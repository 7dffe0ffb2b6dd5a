/* towerpack gpu: private structures shared by the graph builder, the model
 * executor and the checkpoint code. Not installed. */
#ifndef TOWERPACK_GPU_GRAPH_INTERNAL_H
#define TOWERPACK_GPU_GRAPH_INTERNAL_H

#include <pthread.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"
#include "gpu/graph/collective.h"
#include <towerpack/graph.h>
#include <towerpack/optim.h>

#define TP_SCOPE_DEPTH 16
#define TP_NAME_MAX 256
/* Costs per tower: the main one (tp_tower_set_cost) plus named extras. */
#define TP_COSTS_MAX 8

/* A variable shared by all towers; its value lives in the model's trainable
 * or model-only arena at `offset` floats. */
typedef struct tp_var {
    char *name;
    tp_shape_t shape;
    size_t count;      /* elements */
    size_t offset;     /* floats into the arena of its collection */
    int trainable;
    tp_init_t init;
} tp_var_t;

struct tp_node {
    int id;            /* index in the tower's node list (topological) */
    char *name;
    tp_op_kind_t kind;
    tp_dtype_t dtype;
    tp_shape_t shape;  /* planned shape: dim 0 = planned batch if batched */
    int batched;       /* dim 0 is the batch dimension */
    int ninputs;
    tp_node_t **inputs;
    tp_op_attr_t attr;
    int var;           /* VARIABLE: index into the model's variables */
    int input;         /* INPUT: index into the input descriptions */
    int want_grad;     /* INPUT: its gradient was asked for
                          (tp_tower_input_gradient) */
    tp_node_t *state[2]; /* batch norm: moving mean and variance nodes */

    /* planned at build */
    int on_cost_path;  /* the cost depends on it */
    int needs_grad;    /* depends on a trainable variable */
    int backward;      /* gets a gradient buffer and a backward call */
    void *value;       /* shape.count * dtype bytes (aliases for RESHAPE) */
    float *grad;       /* shape.count floats, or NULL */
    void *workspace;
    size_t workspace_bytes;
    int *dx_acc;       /* [ncosts x ninputs]: per cost, overwrite (0) or
                          add (1) into each input's gradient */
    unsigned cost_mask; /* bit k: backward runs for cost k */
    tp_node_t *grad_alias; /* the consumer whose output gradient is also this
                              node's (identity backward, sole consumer) */
    unsigned alias_mask;   /* inputs whose gradient aliases this node's */
    int fuse_after;    /* trainable VARIABLE: id of the node whose backward
                          writes its gradient last (fused updates) */
    uint64_t prof_fwd_ns, prof_bwd_ns, prof_calls;
    uint64_t prof_fwd_dev_ns, prof_bwd_dev_ns; /* the device's (timer marks) */
    uint64_t prof_fwd_thr_ns, prof_bwd_thr_ns; /* the tower thread's CPU time */
    uint64_t prof_fwd_proc_ns, prof_bwd_proc_ns; /* the process's CPU time */
    int pruned;        /* inference: no wanted output needs it (skipped) */
    /* folds (fold.c): a bias add or relu whose work another node's call
     * does. `folded` is that node: this one makes no call, its value is
     * that node's, and that node's output gradient is this one's. A
     * matmul's `fold_bias` is the bias add folded into it; `hidden` marks
     * a node whose own value a fold overwrote (reading it is an error) */
    tp_node_t *folded;
    tp_node_t *fold_bias;
    int hidden;
    int blk16;         /* value and gradient kept nChw16c (tp_plan_blk16_):
                          only ops that take that layout read them */
    tp_node_t *fold_skip; /* batch norm: the add after it, folded into its
                             call with the add's other operand as the skip
                             (tp_plan_block_end_) */
    tp_node_t *nhwc_into; /* TRANSPOSE NHWC -> NCHW: the conv2d that reads
                             its input as NHWC in its stead (fold.c's
                             tp_plan_nhwc_): no call, no value, no gradient */
    /* per step: the runtime batch */
    tp_shape_t run_shape;
};

typedef struct tp_output {
    char *name;
    tp_node_t *node;
    int metric;
} tp_output_t;

struct tp_tower {
    tp_model_t *model;
    char name[32];
    int index;         /* -1 inference */
    int training;
    int replica;       /* the device it runs on: model->rep[replica] */
    int64_t batch;
    tp_status_t status; /* first build error */

    tp_node_t **nodes;
    int nnodes, cap_nodes;
    tp_node_t **input_nodes; /* [ninputs] */
    tp_node_t *cost;
    /* named costs: [0] is the main cost ("cost", every trainable variable),
     * [1..] tp_tower_add_cost's; var_pattern NULL means every variable */
    tp_node_t *costs[TP_COSTS_MAX];
    char *cost_names[TP_COSTS_MAX];
    char *cost_vars[TP_COSTS_MAX];
    int ncosts;        /* 1 + extras */
    tp_output_t *outputs;
    int noutputs, cap_outputs;
    char *scopes[TP_SCOPE_DEPTH];
    int nscopes;
    unsigned char *var_seen; /* [model vars capacity] asked in this tower */
    int var_seen_cap;

    /* planned memory */
    void *act_arena;
    size_t act_bytes;
    float *grads;      /* [model->ntrain] gradient arena, trainable layout */
    tp_stream_t *stream;
    tp_rng_t rng;
    int64_t run_batch;
    /* fused updates (tower 0 of a one-tower model): trainable variable nodes
     * by fuse_after, descending (backward order), and the variables this
     * tower never differentiates */
    tp_node_t **fuse;
    int nfuse;
    /* the all-reduce in buckets (config.bucket_bytes): ranges [lo, hi) of
     * the gradient arena in the order they are begun, each once node
     * `after`'s backward (the last to write one of its gradients) ran
     * (collective.h) */
    struct tp_bucket *buckets;
    int nbuckets;
    int *fuse_rest;
    int nfuse_rest;
    /* the fused training step recorded as a graph (config.graphs): made at
     * graph_batch after a step at that batch ran call by call */
    tp_graph_t *graph;
    int64_t graph_batch;
    int64_t eager_batch; /* the batch of the last step run call by call */
    /* a device's scalar outputs, copied behind each run into page-locked
     * memory (copy_async): read with no sync of their own. A run writes
     * the third that is neither the one readers read (ready) nor the one
     * a step queued ahead still writes (inflight). */
    float *mirror;       /* [3][noutputs]; NULL on the CPU */
    int mirror_ready;    /* the third with the latest completed run, -1 */
    int mirror_inflight; /* the third of a step queued ahead, -1: none */
    /* time the host spent blocked on the device at the end of its runs
     * (the sync, or the wait for the step before when ahead): the
     * thread running the tower writes it, tp_model_device_wait_ns reads it
     * between runs */
    uint64_t device_wait_ns;
    /* profiling on a backend with timer marks: marks 0 and 1 around a
     * run's ops, then a pair around each op call (prof_node[k], backward
     * when prof_bwd[k]) of the run; read after the run's sync */
    tp_timer_t *prof_timer;
    int prof_cap, prof_ncalls;
    tp_node_t **prof_node;
    unsigned char *prof_bwd;
    uint64_t prof_run_dev_ns; /* the runs' whole device time, summed */
    uint64_t prof_hold_ns;    /* the holds (timer_hold) in this run */
};

/* fold.c: fold bias adds into the matmuls before them and relus into the
 * op before them (m->config.fold), once the tower's cost masks and
 * accumulation flags are planned and before its aliases and memory. */
void tp_plan_folds_(tp_tower_t *t);
/* fold.c: mark the tensors that stay nChw16c between ops (node->blk16),
 * after the folds, on a backend whose ops->nchw16c says yes. */
void tp_plan_blk16_(tp_tower_t *t);
/* fold.c: fold a batch norm's add (and the relu after it) into the batch
 * norm's call (node->fold_skip), after the blk16 plan, on a backend whose
 * ops->bnorm_add says yes; TP_CPU_BLOCK_END=0 plans none. */
void tp_plan_block_end_(tp_tower_t *t);
/* fold.c: fold transposes NHWC -> NCHW into the conv2d that alone reads
 * them (node->nhwc_into), after tp_plan_folds_, on a backend whose
 * ops->conv_nhwc runs the call so. */
void tp_plan_nhwc_(tp_tower_t *t);
/* The node whose call does n's work: n->folded, or n itself. */
static inline const tp_node_t *tp_node_caller_(const tp_node_t *n) {
    return n->folded ? n->folded : n;
}

/* memplan.c: `total` bytes of tower t's arena, said as memory. failed 0:
 * TP_OK when a host backend's process can get them (tp_mem_check), else
 * out of memory naming the tower and its largest node; failed 1: the
 * message for an allocation of them that failed. */
tp_status_t tp_plan_memory_(const tp_tower_t *t, size_t total, int failed);

/* memplan.c: one buffer of a tower's arena. bytes: its size (a multiple
 * of TP_ALIGNMENT); lo..hi: the steps of the tower's timeline (forward of
 * node i at i, backward of node i at 2N - i, N nodes) in which it is
 * live, both included; lo < 0: live always (never shares its bytes). off:
 * its offset, set by tp_plan_slots_. */
typedef struct {
    size_t bytes;
    int lo, hi;
    size_t off;
} tp_slot_t;
/* Lay out n slots: the pinned ones one after another in their order (the
 * layout of a plan without reuse), then each other one, largest first, at
 * the lowest offset past the pinned ones where it overlaps no placed slot
 * live at a common step. Returns the arena's bytes; -1 (SIZE_MAX) when
 * memory for the plan's bookkeeping lacks. */
size_t tp_plan_slots_(tp_slot_t *s, int n);

/* Wait for every step a training tower queued ahead (config.ahead): what
 * reads the model's memory other than the next step calls it first. */
tp_status_t tp_model_drain_(tp_model_t *m);

/* The step's state: what one training tower's gradients are now. One
 * writer: model.c's step calls (backward makes them fresh, reduce
 * reduced, update applied); the collective sees only buffers. */
typedef struct tp_grads_state {
    int fresh;    /* backward ran and they are not applied yet (gradients
                     are used once) */
    int cost;     /* the cost whose gradients they are */
    int reduced;  /* they are the towers' all-reduced sum */
    int sliced;   /* this tower applied its slice of the update; the update
                     on every tower that closes the step clears it */
    unsigned held; /* named costs (bit k) whose fresh gradients a later
                      backward of another named cost over other variables
                      left intact: still to apply (a GAN's two players'
                      gradients at one point, each then applied) */
    int forward;  /* the tower's activations are its last forward's, at
                     the variables as they still are: a backward-only run
                     (TP_RUN_BACKWARD without TP_RUN_FORWARD) may
                     differentiate them; an update ends it */
} tp_grads_state_t;

/* One device's copy of the model's state (towers on several devices,
 * tp_model_config_t.devices): the towers on the device read its arenas,
 * and every replica applies the same update from the all-reduced
 * gradients, so they stay equal. rep[0] is the model's own (inference,
 * tp_model_var, checkpoints); a model on one device has only it. */
typedef struct tp_replica {
    tp_backend_t *backend;
    float *train_arena; /* [ntrain] trainable variables */
    float *model_arena; /* [nmodel] model-only variables */
    float *slots[2];    /* [ntrain] each: the optimizer's */
    tp_stream_t *stream; /* updates from one thread, initial values */
} tp_replica_t;

struct tp_model {
    tp_backend_t *backend; /* rep[0].backend */
    int own_backend;
    tp_model_config_t config;
    tp_input_desc_t *inputs;
    int ninputs;
    char *name;        /* the description's name, or NULL */
    char **meta;       /* [2 * nmeta] key, value, ...: what every checkpoint's
                          metadata adds (tp_checkpoint_set_meta) */
    int nmeta;

    tp_var_t *vars;
    int nvars, cap_vars;
    size_t ntrain;     /* floats in the trainable arena (padded) */
    size_t nmodel;     /* floats in the model-only arena */
    tp_replica_t rep[TP_MODEL_DEVICES_MAX];
    int nrep;          /* devices the towers span (>= 1) */

    tp_tower_t **towers;
    int ntowers;
    tp_tower_t *infer;

    tp_optimizer_t *opt;
    int nslots;
    /* the EMA of the trainable variables (the optimizer's ema_decay when
     * built): nema shadow model-only variables from vars[ema_first] on,
     * their values contiguous at ema_offset floats into the model arena in
     * the trainable arena's layout ([ntrain]); nema 0: none */
    int ema_first, nema;
    size_t ema_offset;
    float *ema_saved;  /* [ntrain] on device 0: the weights while the
                          average is in their place (tp_model_use_ema) */
    int ema_in_use;
    /* gradient accumulation (the optimizer's accumulate > 1 when built):
     * the sum, nacc shadows from vars[acc_first] on laid out as the EMA's
     * at acc_offset, and acc_count_var, a [1] model-only variable holding
     * how many steps' gradients are in it; nreal: the variables before
     * every shadow (the tower functions') */
    int acc_first, nacc, acc_count_var, nreal;
    size_t acc_offset;
    tp_comm_t *comm;   /* the towers' (several towers) */
    tp_comm_t *ranks;  /* the processes' (tp_model_comm_join), or NULL */
    tp_grads_state_t *step; /* [ntowers] the step's state, tower by tower */
    size_t memory;
    int profiling;
    uint64_t prune_serial; /* tp_model_prune's successful calls */
    /* the all-reduce fused with SGD's coupled decay (allreduce_sgd_wd):
     * wd_seg [nwd + 1] the trainable arena cut at every variable's ends
     * (built with comm), wd_var [nwd]; wd_decay [ntowers x nwd] each tower's decays of
     * those segments, refilled by its own thread at every update */
    size_t *wd_seg;
    int *wd_var;       /* [nwd] each segment's variable, -1: padding */
    float *wd_decay;
    int nwd;
};

/* graph.c */
tp_tower_t *tp_tower_new_(tp_model_t *m, int index, int training,
                          int64_t batch);
void tp_tower_destroy_(tp_tower_t **t_p);
tp_tower_t *tp_model_tower_(tp_model_t *m, int tower);
/* Variable i's value in replica r (0: the model's own). */
float *tp_var_data_(tp_model_t *m, int r, int i);
/* The backend tower t runs on. */
static inline tp_backend_t *tp_tower_backend_(const tp_tower_t *t) {
    return t->model->rep[t->replica].backend;
}

/* optim.c: slot buffer pointers for checkpoints */
uint64_t tp_hash_name_(const char *s);

/* optim.c: 1 when o's update of a variable at multipliers 1 is exactly one
 * sgd_update call (SGD with no weight decay), with its arguments in *lr,
 * *momentum, *nesterov: what the all-reduce may fuse (allreduce_sgd);
 * else 0. */
int tp_optimizer_plain_sgd_(const tp_optimizer_t *o, float *lr, float *momentum,
                            int *nesterov);
/* optim.c: 1 when o is SGD (any coupled weight decay, in *weight_decay:
 * a variable's is (float)(*weight_decay x its decay multiplier)), with
 * the other arguments as tp_optimizer_plain_sgd_ gives them: what the
 * all-reduce may fuse with the decay (allreduce_sgd_wd); else 0. */
int tp_optimizer_sgd_wd_(const tp_optimizer_t *o, float *lr, float *momentum,
                         int *nesterov, double *weight_decay);
/* optim.c: 1 when o is Adam or AdamW, with the arguments of the
 * adam_update call of a variable at learning-rate multiplier 1 (its decay
 * is (float)(*weight_decay x its decay multiplier); Adam's 0): what the
 * all-reduce may fuse (allreduce_adam); else 0. */
int tp_optimizer_adam_(const tp_optimizer_t *o, float *lr, float *beta1, float *beta2,
                       float *eps, double *weight_decay, int64_t *step);

#endif
