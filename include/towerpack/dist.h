/* towerpack: data-parallel training across processes and hosts
 * (tensorpack's HorovodTrainer, on MPI).
 *
 * One process (rank) per device, started by an existing launcher: Open MPI's
 * mpirun, or Slurm's srun. The ranks find each other through MPI. Every
 * step, each rank computes the gradients of its own towers on its own
 * batches, the ranks average tower 0's gradients with MPI_Allreduce (the
 * gradient arena cut into a few large buckets, all in flight at once), and
 * every rank applies the same update: the replicas stay identical. Rank 0
 * is the chief: chief-only callbacks (savers, JSONWriter, progress bar,
 * ScalarPrinter) run there only, and its variables, optimizer state and
 * resume point are broadcast to the others before the first step.
 *
 *   tp_dist_t *d = NULL;
 *   if (tp_dist_env(NULL, NULL, NULL)) {          // under mpirun or srun
 *       TP_TRY(tp_dist_open(&d));                 // MPI_Init, heartbeat
 *       TP_TRY(tp_dist_configure(d, &cfg, 1));    // shard input, hooks
 *       if (tp_dist_rank(d) != 0)
 *           cfg.logdir = NULL;                    // rank 0 owns the logdir
 *   }
 *   rc = tp_launch_train_with_config(&cfg, NULL);
 *   if (rc < 0 && d)
 *       tp_dist_abort(d, 1, tp_last_error());     // the others would wait
 *   tp_dist_close(&d);                            // barrier, MPI_Finalize
 *
 * The MPI code lives in a separate module, libtowerpack_mpi.so, built only
 * when Open MPI is found (TP_WITH_MPI) and loaded by tp_dist_open: the core
 * library and every program built on it never link libmpi.
 *
 * A rank that dies or hangs stops the job within a bounded time: a heartbeat
 * thread on every rank reports to rank 0 (over ZeroMQ, beside MPI); rank 0
 * aborts the job (MPI_Abort) naming a rank silent for longer than
 * TP_DIST_HEARTBEAT_TIMEOUT seconds (default 10), and the others abort when
 * rank 0 falls silent. An all-reduce that has not completed after
 * TP_DIST_STEP_TIMEOUT seconds (default 300) aborts too. See
 * docs/distributed.md. */
#ifndef TOWERPACK_DIST_H
#define TOWERPACK_DIST_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/graph_dist.h>  /* the model's calls across processes */
#include <towerpack/launch.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_dist tp_dist_t;

/* Rank and size a launcher put in the environment: Open MPI
 * (OMPI_COMM_WORLD_RANK/SIZE), PMI (PMI_RANK/SIZE: MPICH, srun --mpi=pmi2)
 * or Slurm (SLURM_PROCID/NTASKS). 1 when one is found with size >= 2 (then
 * *launcher names it); 0 for a plain run. Any pointer may be NULL. */
int tp_dist_env(int *rank, int *size, const char **launcher);
/* This rank's place among the ranks on its host, as the launcher says
 * (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID): the GPU it
 * takes with tp-train --devices local. -1 when none says. */
int tp_dist_local_rank(void);

/* Load libtowerpack_mpi ($TP_MPI_MODULE, next to libtowerpack, ../lib, then
 * the loader's path), initialise MPI and start the heartbeat. Caller owns.
 * TP_ERR_UNSUPPORTED when this build has no MPI module. */
tp_status_t tp_dist_open(tp_dist_t **out);
/* Barrier (a bounded one), stop the heartbeat, MPI_Finalize. */
void tp_dist_close(tp_dist_t **self_p);

int tp_dist_rank(const tp_dist_t *self);
int tp_dist_size(const tp_dist_t *self);
/* The host this rank runs on. */
const char *tp_dist_host(const tp_dist_t *self);

/* Make `cfg` train data-parallel over the ranks: the input (cfg->input, or
 * a QueueInput over cfg->dataflow) becomes this rank's shard
 * (tp_input_shard), and the launch broadcasts rank 0's state, all-reduces
 * the gradients and runs chief-only callbacks on rank 0 only. Non-chief
 * ranks should pass cfg->logdir = NULL (rank 0 alone owns the log
 * directory: it finds the checkpoint to resume from and tells the others).
 * `shard`: 0 when each rank already reads its own data (its own tp-worker
 * processes): the input is then left alone. `d` must outlive the launch. */
tp_status_t tp_dist_configure(tp_dist_t *d, tp_train_config_t *cfg, int shard);

/* End the whole job from this rank: logs "rank R: msg" on stderr, then
 * MPI_Abort with `code`. Does not return. */
void tp_dist_abort(tp_dist_t *d, int code, const char *msg);

/* Rank `rank` of `size`'s share of a batch stream: of every group of
 * towers x size batches the inner input gives (one step of the whole job),
 * this rank's towers take batches rank x towers .. rank x towers + towers-1,
 * in order. With the same seed on every rank each batch is trained exactly
 * once per pass, and rank r's tower t sees what tower r x towers + t of one
 * process with towers x size towers would. Every rank still produces the
 * whole stream (and drops the rest): for expensive pipelines give each rank
 * its own tp-worker processes instead. Takes inner. */
tp_input_t *tp_input_shard(tp_input_t *inner, int rank, int size);

/* ---- the module's interface (libtowerpack_mpi exports tp_dist_module) ---- */

#define TP_DIST_MODULE_ABI 1

typedef struct tp_dist_module {
    int abi;   /* TP_DIST_MODULE_ABI */
    /* MPI_Init, rank, size, heartbeat thread. msg[size] gets the reason of a
     * failure (the module does not share the core's error state). */
    int (*init)(void **ctx, int *rank, int *size, char *msg, size_t msgsize);
    /* In place: buf := the mean of every rank's buf (n floats); bounded by
     * the step timeout. `step` names the step in errors and heartbeats. */
    int (*allreduce_mean)(void *ctx, float *buf, size_t n, int64_t step,
                          char *msg, size_t msgsize);
    /* In place: rank 0's `bytes` bytes to every rank; bounded. */
    int (*broadcast)(void *ctx, void *buf, size_t bytes, char *msg,
                     size_t msgsize);
    /* Abort the whole job. Does not return. */
    void (*abort)(void *ctx, int code, const char *msg);
    /* Bounded barrier, heartbeat stop, MPI_Finalize. */
    void (*finalize)(void *ctx);
    /* This rank's host name. */
    const char *(*host)(void *ctx);
} tp_dist_module_t;

#ifdef __cplusplus
}
#endif
#endif
