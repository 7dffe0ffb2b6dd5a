/* towerpack dist: data-parallel training over processes, the part that
 * needs no MPI: finding the launcher in the environment, loading the MPI
 * module (libtowerpack_mpi.so), the launch's hooks (resume point and model
 * state from rank 0, the gradients' mean every step) and the shard input.
 *
 * Why a module: the core library must not link libmpi (a build without
 * Open MPI is a normal build, and a plain tp-train never loads it), so the
 * MPI calls sit behind the function table of dist.h and are dlopen'ed only
 * when a launcher started this process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/dist.h>
#include <towerpack/log.h>
#include <towerpack/backend.h>
#include <towerpack/optim.h>
#include <towerpack/graph.h>
#include <towerpack/module.h>

#ifndef TP_MPI_MODULE_NAME
#define TP_MPI_MODULE_NAME "libtowerpack_mpi.so"
#endif

struct tp_dist {
    void *handle;                   /* the dlopen'ed module */
    const tp_dist_module_t *mod;
    void *ctx;
    int rank, size;
    tp_train_dist_t hooks;
    int on_device;  /* the model's gradients are all-reduced on its GPU */
};

/* ---- the launcher's environment ------------------------------------------- */

static int s_env_int(const char *name, int *out) {
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > INT_MAX)
        return 0;
    *out = (int)x;
    return 1;
}

int tp_dist_local_rank(void) {
    static const char *const k[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                    "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int r = 0;
        if (s_env_int(k[i], &r))
            return r;
    }
    return -1;
}

int tp_dist_env(int *rank, int *size, const char **launcher) {
    static const struct { const char *rank, *size, *name; } k[] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
        {"PMI_RANK", "PMI_SIZE", "PMI"},
        {"PMIX_RANK", "PMIX_SIZE", "PMIx"},   /* PMIX_SIZE is rarely set */
        {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int r = 0, s = 0;
        if (s_env_int(k[i].rank, &r) && s_env_int(k[i].size, &s) && s >= 2 &&
            r < s) {
            if (rank)
                *rank = r;
            if (size)
                *size = s;
            if (launcher)
                *launcher = k[i].name;
            return 1;
        }
    }
    return 0;
}

/* ---- the module ------------------------------------------------------------- */

static tp_status_t s_agree_start(void *ctx, int64_t *resume_step,
                                 int64_t *starting_epoch);
static tp_status_t s_sync_model(void *ctx, tp_model_t *m, uint64_t seed,
                                int64_t resume_step);
static tp_status_t s_allreduce_grads(void *ctx, tp_model_t *m, int64_t step);

tp_status_t tp_dist_open(tp_dist_t **out) {
    *out = NULL;
    tp_dist_t *self = calloc(1, sizeof *self);
    if (!self)
        return tp_error(TP_ERR_NOMEM, "distributed runtime");
    char why[1024] = "";
    /* TP_MODULE_GLOBAL: Open MPI's own plugins resolve libmpi's symbols
     * through the global scope. */
    self->handle = tp_module_open("MPI", TP_MPI_MODULE_NAME, "TP_MPI_MODULE",
                                  TP_MODULE_GLOBAL, why, sizeof why);
    if (!self->handle) {
        free(self);
        return tp_error(TP_ERR_UNSUPPORTED, "distributed training needs the MPI "
                        "module %s, which this build does not have (%s): build "
                        "towerpack with Open MPI installed (apt-get install "
                        "libopenmpi-dev; TP_WITH_MPI)", TP_MPI_MODULE_NAME, why);
    }
    const tp_dist_module_t *(*get)(void) =
        (const tp_dist_module_t *(*)(void))dlsym(self->handle, "tp_dist_module");
    self->mod = get ? get() : NULL;
    if (!self->mod || self->mod->abi != TP_DIST_MODULE_ABI) {
        dlclose(self->handle);
        free(self);
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no tp_dist_module of ABI %d "
                        "(a module from another build?)", TP_MPI_MODULE_NAME,
                        TP_DIST_MODULE_ABI);
    }
    char msg[1024] = "";
    if (self->mod->init(&self->ctx, &self->rank, &self->size, msg, sizeof msg) < 0) {
        /* MPI cannot be initialised twice: the module stays loaded */
        free(self);
        return tp_error(TP_ERR_PEER, "starting MPI: %s", msg);
    }
    self->hooks = (tp_train_dist_t){
        .rank = self->rank, .size = self->size, .ctx = self,
        .agree_start = s_agree_start, .sync_model = s_sync_model,
        .allreduce_grads = s_allreduce_grads,
    };
    *out = self;
    return TP_OK;
}

void tp_dist_close(tp_dist_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_dist_t *self = *self_p;
    self->mod->finalize(self->ctx);
    /* not dlclose'd: Open MPI's atexit hooks and threads may still refer to
     * it */
    free(self);
    *self_p = NULL;
}

int tp_dist_rank(const tp_dist_t *self) { return self->rank; }
int tp_dist_size(const tp_dist_t *self) { return self->size; }
const char *tp_dist_host(const tp_dist_t *self) { return self->mod->host(self->ctx); }

void tp_dist_abort(tp_dist_t *d, int code, const char *msg) {
    d->mod->abort(d->ctx, code, msg);
    _exit(code ? code : 1);   /* not reached */
}

/* ---- the launch's hooks ------------------------------------------------------ */

static tp_status_t s_bcast(tp_dist_t *d, void *buf, size_t bytes, const char *what) {
    char msg[1024] = "";
    if (d->mod->broadcast(d->ctx, buf, bytes, msg, sizeof msg) < 0)
        return tp_error(TP_ERR_PEER, "rank %d: broadcasting %s from rank 0: %s",
                        d->rank, what, msg);
    return TP_OK;
}

static tp_status_t s_agree_start(void *ctx, int64_t *resume_step,
                                 int64_t *starting_epoch) {
    tp_dist_t *d = ctx;
    int64_t v[2] = {*resume_step, *starting_epoch};
    TP_TRY(s_bcast(d, v, sizeof v, "the resume point"));
    if (d->rank != 0 && v[0] >= 0)
        TP_INFO("rank %d: rank 0 resumes at global step %lld (epoch %lld)",
                d->rank, (long long)v[0], (long long)v[1]);
    *resume_step = v[0];
    *starting_epoch = v[1];
    return TP_OK;
}

/* The stream model.c gives tower i (kept equal, so that rank r's tower t
 * draws what tower r x towers + t of one process would). */
#define TP_TOWER_RNG_SALT 0x5eed0f70e75ull

/* Broadcast `n` floats of the model's memory from rank 0: in place on the
 * CPU; on a device through a host buffer (MPI moves host memory). */
static tp_status_t s_bcast_floats(tp_dist_t *d, tp_backend_t *b, float *p, size_t n,
                                  const char *what) {
    if (tp_backend_device(b) < 0)
        return s_bcast(d, p, n * sizeof(float), what);
    float *h = malloc(n * sizeof(float) + 1);
    if (!h)
        return tp_error(TP_ERR_NOMEM, "rank %d: %zu floats of %s", d->rank, n, what);
    tp_status_t rc = tp_backend_copy(b, h, p, n * sizeof(float));
    if (rc == TP_OK)
        rc = s_bcast(d, h, n * sizeof(float), what);
    if (rc == TP_OK)
        rc = tp_backend_copy(b, p, h, n * sizeof(float));
    free(h);
    return rc;
}

/* A model on a device all-reduces its gradients over the processes on the
 * device (NCCL): rank 0 makes the communicator's id, MPI's broadcast takes
 * it to every rank, and each joins. */
static tp_status_t s_join_ranks(tp_dist_t *d, tp_model_t *m) {
    struct {
        uint64_t len;
        unsigned char id[TP_COMM_ID_MAX];
    } msg;
    memset(&msg, 0, sizeof msg);
    tp_status_t rc = TP_OK;
    if (d->rank == 0) {
        size_t len = 0;
        rc = tp_model_comm_id(m, msg.id, &len);
        msg.len = rc == TP_OK ? len : 0;  /* 0: rank 0 failed, say so below */
    }
    TP_TRY(s_bcast(d, &msg, sizeof msg, "the GPUs' communicator id"));
    if (rc < 0)
        return tp_error_wrap(rc, "rank 0: a communicator id for the GPUs");
    if (msg.len == 0 || msg.len > TP_COMM_ID_MAX)
        return tp_error(TP_ERR_PEER, "rank %d: rank 0 could not make the GPUs' "
                        "communicator id (its log says why)", d->rank);
    TP_TRY(tp_model_comm_join(m, d->size, d->rank, msg.id, (size_t)msg.len));
    d->on_device = 1;
    TP_INFO("rank %d of %d: gradients all-reduced on the GPU over the processes",
            d->rank, d->size);
    return TP_OK;
}

static tp_status_t s_sync_model(void *ctx, tp_model_t *m, uint64_t seed,
                                int64_t resume_step) {
    tp_dist_t *d = ctx;
    /* MPI moves host memory: a model on the CPU is broadcast in place; one
     * on a GPU through host buffers, and its gradients are all-reduced on
     * the GPUs (NCCL, the id sent over MPI). */
    tp_backend_t *b = tp_model_backend(m);
    /* Every rank must have built the same model: compare layouts first, so a
     * mismatch is an error naming both sides, not a corrupt broadcast. */
    tp_model_arenas_t a;
    tp_model_arenas(m, &a);
    tp_optimizer_t *opt = tp_model_optimizer(m);
    int64_t mine[4] = {(int64_t)a.ntrain, (int64_t)a.nmodel, a.nslots,
                       opt ? tp_optimizer_step(opt) : 0};
    int64_t root[4];
    memcpy(root, mine, sizeof root);
    TP_TRY(s_bcast(d, root, sizeof root, "the model's layout"));
    if (root[0] != mine[0] || root[1] != mine[1] || root[2] != mine[2])
        return tp_error(TP_ERR_SHAPE, "rank %d built a model of %lld trainable "
                        "floats, %lld model floats and %lld optimizer slots; "
                        "rank 0's has %lld, %lld and %lld (same --model and "
                        "flags on every rank?)", d->rank, (long long)mine[0],
                        (long long)mine[1], (long long)mine[2],
                        (long long)root[0], (long long)root[1], (long long)root[2]);
    TP_TRY(s_bcast_floats(d, b, a.train, a.ntrain, "the variables"));
    if (a.nmodel)
        TP_TRY(s_bcast_floats(d, b, a.model, a.nmodel, "the model-only variables"));
    for (int i = 0; i < a.nslots; i++)
        TP_TRY(s_bcast_floats(d, b, a.slots[i], a.ntrain, "the optimizer's slots"));
    if (tp_backend_device(b) >= 0)
        TP_TRY(s_join_ranks(d, m));
    if (opt)
        tp_optimizer_set_step(opt, root[3]);
    /* Dropout: each rank's towers draw their own streams. A resumed run
     * takes rank 0's generators from the checkpoint; the others start new,
     * distinct streams (a resumed run's dropout is not bit-identical to an
     * unbroken one on those ranks). */
    if (d->rank != 0 || resume_step < 0) {
        int towers = a.ntowers;
        uint64_t jump = resume_step >= 0 ? (uint64_t)(resume_step + 1) << 20 : 0;
        for (int t = 0; t < towers; t++)
            tp_rng_init(tp_model_tower_rng(m, t), seed ^ TP_TOWER_RNG_SALT,
                        jump + (uint64_t)(d->rank * towers + t));
    }
    TP_INFO("rank %d of %d: variables%s from rank 0", d->rank, d->size,
            a.nslots ? " and optimizer state" : "");
    return TP_OK;
}

static tp_status_t s_allreduce_grads(void *ctx, tp_model_t *m, int64_t step) {
    tp_dist_t *d = ctx;
    if (d->on_device) {
        tp_status_t rc = tp_model_allreduce_ranks(m);
        return rc < 0 ? tp_error_wrap(TP_ERR_PEER, "rank %d: gradient all-reduce "
                                      "of step %lld on the GPUs", d->rank,
                                      (long long)step)
                      : TP_OK;
    }
    char msg[1024] = "";
    tp_model_arenas_t a;
    tp_model_arenas(m, &a);
    if (d->mod->allreduce_mean(d->ctx, a.grads, a.ntrain, step,
                               msg, sizeof msg) < 0)
        return tp_error(TP_ERR_PEER, "rank %d: gradient all-reduce of step %lld: %s",
                        d->rank, (long long)step, msg);
    return TP_OK;
}

tp_status_t tp_dist_configure(tp_dist_t *d, tp_train_config_t *cfg, int shard) {
    if (!d || !cfg)
        return tp_error(TP_ERR_INVALID, "tp_dist_configure: NULL argument");
    if (shard) {
        tp_input_t *in = cfg->input;
        cfg->input = NULL;
        if (!in && cfg->dataflow) {
            in = tp_input_queue(cfg->dataflow, 50);
            cfg->dataflow = NULL;
        }
        if (!in)
            return tp_error(TP_ERR_INVALID, "tp_dist_configure: the config has "
                            "no input or dataflow to shard");
        cfg->input = tp_input_shard(in, d->rank, d->size);
        if (!cfg->input)
            return tp_error_wrap(TP_ERR_NOMEM, "shard input");
    }
    cfg->dist = &d->hooks;
    return TP_OK;
}

/* ---- the shard input -------------------------------------------------------- */

typedef struct {
    tp_input_t *inner;
    int rank, size, towers;
    int64_t pos;     /* batches taken from inner since start */
    int64_t calls;   /* batches given since start */
} s_shard_t;

static tp_status_t shard_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_shard_t *s = impl;
    s->towers = towers > 0 ? towers : 1;
    s->pos = s->calls = 0;
    const tp_input_ops_t *ops = tp_input_ops(s->inner);
    /* `skip` counts this rank's batches: the whole job took size times as
     * many from the common stream */
    return ops->start(tp_input_impl(s->inner), towers, seed, skip * s->size);
}

static tp_status_t shard_next(void *impl, int tower, tp_datapoint_t **out) {
    s_shard_t *s = impl;
    const tp_input_ops_t *ops = tp_input_ops(s->inner);
    void *in = tp_input_impl(s->inner);
    int64_t group = (int64_t)s->towers * s->size;
    int64_t target = (s->calls / s->towers) * group +
                     (int64_t)s->rank * s->towers + s->calls % s->towers;
    while (s->pos < target) {  /* the other ranks' batches */
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = ops->next(in, tower, &dp);
        if (rc < 0)
            return tp_error_wrap(rc, "shard %d/%d", s->rank, s->size);
        tp_datapoint_destroy(&dp);
        s->pos++;
    }
    tp_status_t rc = ops->next(in, tower, out);
    if (rc < 0)
        return tp_error_wrap(rc, "shard %d/%d", s->rank, s->size);
    s->pos++;
    s->calls++;
    return TP_OK;
}

static int64_t shard_size(void *impl) {
    s_shard_t *s = impl;
    const tp_input_ops_t *ops = tp_input_ops(s->inner);
    int64_t n = ops->size(tp_input_impl(s->inner));
    return n > 0 ? (n + s->size - 1) / s->size : n;
}

static void shard_stop(void *impl) {
    s_shard_t *s = impl;
    const tp_input_ops_t *ops = tp_input_ops(s->inner);
    if (ops->stop)
        ops->stop(tp_input_impl(s->inner));
}

static void shard_destroy(void *impl) {
    s_shard_t *s = impl;
    tp_input_destroy(&s->inner);
    free(s);
}

/* A shard adds no thread of its own: its statistics are its input's. */
static int shard_stats(void *impl, tp_stats_row_t *rows, int max) {
    return tp_input_stats(((s_shard_t *)impl)->inner, rows, max);
}

static int shard_scalars(void *impl, tp_input_scalar_t *out, int max) {
    return tp_input_scalars(((s_shard_t *)impl)->inner, out, max);
}

static const tp_input_ops_t s_shard_ops = {
    .name = "ShardInput", .start = shard_start, .next = shard_next,
    .size = shard_size, .stop = shard_stop, .destroy = shard_destroy,
    .stats = shard_stats, .scalars = shard_scalars,
};

tp_input_t *tp_input_shard(tp_input_t *inner, int rank, int size) {
    if (!inner)
        return NULL;
    if (size < 1 || rank < 0 || rank >= size) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_INVALID, "shard input: rank %d of %d", rank, size);
        return NULL;
    }
    s_shard_t *s = calloc(1, sizeof *s);
    if (!s) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "shard input");
        return NULL;
    }
    s->inner = inner;
    s->rank = rank;
    s->size = size;
    s->towers = 1;
    return tp_input_new(&s_shard_ops, s);
}
