/* towerpack: input sources (tensorpack's InputSource), the trainer's side
 * of the data: FeedInput, QueueInput, StagingInput, ZMQInput,
 * DummyConstantInput and ResidentInput, and the calls that drive any input
 * (a custom trainer's run_step takes its batches with tp_input_next).
 *
 *   tp_input_t *in = tp_input_queue(tp_df_batch(tp_df_fashion_mnist("train", 1),
 *                                               128, 0), 0);
 *   TP_TRY(tp_input_start(in, 1, 42, 0));       // one tower, data seed 42
 *   tp_datapoint_t *batch = NULL;
 *   TP_TRY(tp_input_next(in, 0, &batch));       // tower 0's next batch
 *   tp_input_release(in, 0, &batch);            // done with it
 *   tp_input_destroy(&in);
 *
 * tp_train_config_t.input (launch.h) takes an input instead of a dataflow.
 * (These declarations were in launch.h, which still includes this header.) */
#ifndef TOWERPACK_INPUT_H
#define TOWERPACK_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/dataflow.h>
#include <towerpack/datapoint.h>
#include <towerpack/graph.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- input sources -------------------------------------------------------- */

typedef struct tp_input tp_input_t;
typedef struct tp_stats_row tp_stats_row_t;  /* towerpack/stats.h */

/* One number an input puts into stats.json after each epoch. */
#define TP_INPUT_SCALAR_NAME_MAX 48
typedef struct tp_input_scalar {
    char name[TP_INPUT_SCALAR_NAME_MAX];  /* "QueueInput/queue_fill" */
    double value;
} tp_input_scalar_t;

typedef struct tp_input_ops {
    const char *name;
    /* Prepare (seed the dataflow, start prefetching), first dropping `skip`
     * batches: a resumed run continues the data stream where the
     * checkpoint left it. */
    tp_status_t (*start)(void *impl, int towers, uint64_t seed, int64_t skip);
    /* The next batch for `tower` (caller owns). Passes wrap around: an
     * epoch is the trainer's period, not one pass of the data. */
    tp_status_t (*next)(void *impl, int tower, tp_datapoint_t **out);
    /* Batches per pass, or -1 when unknown. */
    int64_t (*size)(void *impl);
    /* Stop prefetching (may be NULL). */
    void (*stop)(void *impl);
    void (*destroy)(void *impl);
    /* Warn, naming what starves, when a tower waits longer than `seconds`
     * for a batch (0: never). May be NULL. */
    void (*set_watchdog)(void *impl, double seconds);
    /* Take back a batch from `next` that the caller is done with, to free
     * it off the caller's thread (any thread may call it). May be NULL:
     * the batch is destroyed on the caller's thread. */
    void (*release)(void *impl, int tower, tp_datapoint_t *dp);
    /* The rows this input contributes to the statistics the trainer
     * publishes for tp-top (its prefetch actor, its stages, its receiver):
     * at most `max` into `rows`, returns how many. An input that wraps
     * another passes on to it first and adds its own. Called between
     * steps on the trainer's thread: it must not wait for the input's
     * threads. May be NULL: no rows. */
    int (*stats)(void *impl, tp_stats_row_t *rows, int max);
    /* The same for the scalars that go into stats.json after each epoch.
     * May be NULL: none. */
    int (*scalars)(void *impl, tp_input_scalar_t *out, int max);
    /* The towers' backends, once the model is built (before the first
     * next): tower i's is backends[i % n] (n == 1: one for every tower;
     * towers on several devices: one each). An input that makes its
     * batches in the towers' memory (ResidentInput) moves there. May be
     * NULL: batches are host memory. */
    tp_status_t (*bind)(void *impl, tp_backend_t *const *backends, int n);
} tp_input_ops_t;

/* An input over `impl`; takes it. Caller owns. */
tp_input_t *tp_input_new(const tp_input_ops_t *ops, void *impl);
void tp_input_destroy(tp_input_t **self_p);
const char *tp_input_name(const tp_input_t *self);

/* Drive an input from a trainer's run_step (custom trainers): start it for
 * `towers` towers with the data seed (dropping `skip` batches first), take
 * the next batch of `tower` (caller owns it), ask its size (batches per
 * pass, -1: unknown). */
tp_status_t tp_input_start(tp_input_t *self, int towers, uint64_t seed,
                           int64_t skip);
tp_status_t tp_input_next(tp_input_t *self, int tower, tp_datapoint_t **out);
/* Give back a batch taken with tp_input_next once the step is done with it
 * (sets *dp_p to NULL). The same as tp_datapoint_destroy, except that an
 * input may free it on its own thread: QueueInput's prefetch actor does,
 * which keeps the allocator's work off the training thread. */
void tp_input_release(tp_input_t *self, int tower, tp_datapoint_t **dp_p);
int64_t tp_input_size(tp_input_t *self);
/* The step watchdog's period for this input (inputs without one ignore
 * it); inputs wrapping another pass it on. */
void tp_input_set_watchdog(tp_input_t *self, double seconds);
/* The input's statistics rows (its ops' stats entry): at most `max` rows,
 * returns how many (0 for an input without the entry). The trainer
 * publishes them with its own and the towers' rows. */
int tp_input_stats(tp_input_t *self, tp_stats_row_t *rows, int max);
/* The input's epoch scalars (its ops' scalars entry), as above. */
int tp_input_scalars(tp_input_t *self, tp_input_scalar_t *out, int max);
/* Tell the input the towers' backend (its ops' bind entry; TP_OK for an
 * input without one). The launch does, after building the model. An input
 * with a bind entry puts its batches in the towers' memory (ResidentInput
 * makes them there, StagingInput copies them there on a device). */
tp_status_t tp_input_bind(tp_input_t *self, tp_backend_t *backend);
/* The same for towers on several devices: tower i's backend is
 * backends[i % n] (tp_model_tower_backend). */
tp_status_t tp_input_bind_towers(tp_input_t *self, tp_backend_t *const *backends,
                                 int n);

/* ResidentInput: the whole data set in the towers' memory (device memory
 * on a GPU), made into augmented batches there; per step the host only
 * draws the picks (tp_backend_augment_batch, backend.h). One pass of `df`
 * (datapoints [image uint8 [h,w] or [h,w,c], label int32/int64]) is read
 * at start; its batches are [image float32 [batch, crop_h, crop_w(, c)],
 * label int32 [batch]]: each image padded by `pad` zeros, cropped at a
 * random place, mirrored with probability 1/2 when `flip`, normalised as
 * (v - mean) * (1 / std) (default 0 and 255: 0..1), the same chain as the
 * dataflow spec `augment crop=H,pad=P,flip`. A pass is a shuffled
 * permutation, the remainder dropped. Takes df. */
typedef struct tp_resident_opts {
    int64_t batch;       /* per tower (default 32) */
    int crop_h, crop_w;  /* 0: the image's own size */
    int pad;             /* zeros around each image before the crop */
    int flip;            /* 1: mirror left-right with probability 1/2 */
    int shuffle;         /* default 1 */
    int nstats;          /* 0: scale to 0..1; 1: one mean/std for every
                            channel; c: one per channel (at most 4) */
    float mean[4], std[4];
} tp_resident_opts_t;
void tp_resident_opts_init(tp_resident_opts_t *opts);
tp_input_t *tp_input_resident(tp_dataflow_t *df, const tp_resident_opts_t *opts);

/* FeedInput: batches straight from the dataflow on the trainer's thread,
 * synchronous (for debugging). Takes df. */
tp_input_t *tp_input_feed(tp_dataflow_t *df);

/* QueueInput: a prefetch actor runs the dataflow (taken) and keeps up to
 * `capacity` batches (0: 50) ready in a bounded inproc queue. The default
 * input for a dataflow. */
tp_input_t *tp_input_queue(tp_dataflow_t *df, int capacity);
/* The prefetch actor's counters (busy, blocked on a full queue; queue_fill:
 * batches ready in its queue over the capacity), as it last published them
 * (at most about 10 ms old; reading them never waits for the actor). A
 * StagingInput over a QueueInput answers for it. TP_ERR_INVALID for
 * another kind of input. tp_input_stats gives the same row. */
tp_status_t tp_input_queue_stats(tp_input_t *input, tp_stats_row_t *row);
/* Batches the trainer took from a QueueInput, and the seconds it waited for
 * them (0 for other inputs). */
uint64_t tp_input_queue_taken(tp_input_t *input);
/* Batches ready in the queue over its capacity, in [0, 1]; -1 for others. */
double tp_input_queue_fill(tp_input_t *input);
double tp_input_queue_waited_s(tp_input_t *input);
/* The implementation pointer, and the table it was made with (an input
 * that wraps another drives it through both). */
void *tp_input_impl(tp_input_t *self);
const tp_input_ops_t *tp_input_ops(const tp_input_t *self);

/* StagingInput: one staging actor (thread) per tower over `inner` (taken)
 * keeps `nr_stage` batches (0: 1; at most TP_STAGE_MAX) copied ahead into
 * the tower's own memory, so a step finds its batch in place while the
 * previous one computes. The stages take from `inner` in tower order:
 * batches per tower are the same as without staging. A batch handed out
 * borrows a slot until the datapoint is destroyed. The tower's memory:
 * `ops` when given; else, once bound to a device backend (tp_input_bind),
 * that backend's stages (pinned host buffers copied on its copy stream,
 * the copy done before a batch is handed over: the batch's data is then
 * device memory); else host memory. `inner` must give host batches (an
 * input with a bind entry is refused). The default on top of QueueInput
 * for more than one tower, and for towers on a GPU. */
#define TP_STAGE_MAX 8
typedef struct tp_stage_ops {
    /* The tower's memory for a staged component, and freeing it; NULL:
     * 64-byte aligned host memory. */
    void *(*alloc)(void *user, int tower, size_t bytes);
    void (*free)(void *user, int tower, void *ptr);
    /* Copy host `src` into tower memory `dst`, complete on return (a device
     * issues it on the tower's copy stream and waits); NULL: memcpy. */
    tp_status_t (*copy)(void *user, int tower, void *dst, const void *src,
                        size_t bytes);
    void *user;
} tp_stage_ops_t;
tp_input_t *tp_input_staging(tp_input_t *inner, int nr_stage,
                             const tp_stage_ops_t *ops);
/* The input a StagingInput stages (NULL for another kind). */
tp_input_t *tp_input_staging_inner(tp_input_t *input);
/* A stage's counters: batches staged (msgs_out), seconds copying (busy_s),
 * waiting for the inner input or a free slot (starved_s), staged slots
 * over nr_stage (queue_fill). */
tp_status_t tp_input_staging_stats(tp_input_t *input, int tower,
                                   tp_stats_row_t *row);
/* Seconds tower `tower` waited for its staged batch. */
double tp_input_staging_waited_s(tp_input_t *input, int tower);

/* ZMQInput: whole batches from tp-worker processes or other senders of the
 * wire format, received on a PULL socket at `endpoints` (RemoteDataZMQ's
 * syntax: comma-separated, '@' binds, '>' connects, else opts->bind) and
 * decoded on the trainer's thread without a prefetch actor. A malformed
 * message is counted and dropped. opts NULL: defaults (bind, hwm 50, no
 * timeout; signals end a wait). Size -1: set steps_per_epoch. NULL with
 * tp_last_error() on a bad endpoint list. */
typedef struct tp_remote_opts tp_remote_opts_t;
tp_input_t *tp_input_zmq(const char *endpoints, const tp_remote_opts_t *opts);
/* Batches received, messages dropped as malformed, seconds the trainer
 * waited for data, wire bytes received (0 for another kind of input). A
 * wait longer than the step watchdog's period (tp_input_set_watchdog, 10 s
 * by default) is logged naming the input and its senders. */
uint64_t tp_input_zmq_received(tp_input_t *input);
uint64_t tp_input_zmq_malformed(tp_input_t *input);
double tp_input_zmq_waited_s(tp_input_t *input);
uint64_t tp_input_zmq_bytes(tp_input_t *input);
/* Every batch must fit the model's inputs (batch dimension first, as the
 * model describes them) at `batch` (0: any), and with classes > 0 every
 * value of an integer input must lie in 0..classes-1 (a label): one that
 * does not, from any sender, is dropped and counted (stats.json:
 * ZMQInput/unfit) with a warning naming the sender and the mismatch; when
 * no sender left sends fitting batches, training ends saying so. Before
 * the start. */
tp_status_t tp_input_zmq_expect(tp_input_t *input, const tp_input_desc_t *inputs, int n,
                                int64_t batch, int64_t classes);
/* The same expectations for a dataflow that feeds the model (a spec's,
 * tp_df_expect of towerpack/actor_dataflow.h): a remote: source in it
 * checks and drops as ZMQInput does, the workers of a processes stage
 * check their first datapoint. Before its reset_state. */
tp_status_t tp_input_expect_dataflow(tp_dataflow_t *df, const tp_input_desc_t *inputs,
                                     int n, int64_t batch, int64_t classes);

/* DummyConstantInput: one random batch per tower, built once from the
 * model's input descriptions and returned again and again (copies): the
 * speed of light of the step. `label_classes` bounds int inputs. */
tp_input_t *tp_input_dummy(const tp_model_desc_t *model, int64_t batch,
                           int label_classes, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
