/* towerpack tests: ZMQInput, batches straight from remote senders. A sender
 * thread (send_dataflow_zmq, what tp-worker runs) feeds the input over ipc;
 * batches arrive in order, malformed messages are counted and dropped, and
 * a model trains from it through launch_train_with_config, also fed by an
 * actor of the run's own under the training's supervisor. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/towerpack.h>
#include "dir_testutil.h"
#include "train_testutil.h"
#include "zmq_input_testutil.h"
#include <towerpack/launch.h>

static char s_dir[64], s_ep[128];

/* Bound, and a receive gives up after 20 s instead of hanging a broken
 * test (criterion's .timeout leaks in its runner under LeakSanitizer). */
static tp_input_t *s_input(void) {
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    o.timeout_s = 20;
    return tp_input_zmq(s_ep, &o);
}

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-zmqin");
    snprintf(s_ep, sizeof s_ep, "ipc://%s/in.sock", s_dir);
}

static void s_teardown(void) { dt_remove(s_dir); }


Test(zmq_input, batches_arrive_in_order_and_junk_is_dropped, .init = s_setup,
     .fini = s_teardown) {
    tp_input_t *in = s_input();
    cr_assert_not_null(in, "%s", tp_last_error());
    cr_assert_str_eq(tp_input_name(in), "ZMQInput");
    cr_assert_eq(tp_input_size(in), -1);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    static const char *const junk[] = {"not", "a batch", NULL};  /* two frames */
    zi_sender_t s = {.ep = s_ep, .junk = junk, .df = tu_counting(30), .count = 25};
    pthread_t th;
    pthread_create(&th, NULL, zi_send, &s);
    for (int i = 0; i < 25; i++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *t = tp_datapoint_cget(dp, 0);
        cr_assert_eq(t->dtype, TP_INT32);
        cr_assert_eq(((const int32_t *)t->data)[3], i);
        tp_datapoint_destroy(&dp);
    }
    pthread_join(th, NULL);
    cr_assert_eq(s.rc, TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_zmq_received(in), 25);
    cr_assert_eq(tp_input_zmq_malformed(in), 1);
    tp_dataflow_destroy(&s.df);
    tp_input_destroy(&in);
}

Test(zmq_input, a_bad_endpoint_is_named) {
    cr_assert_null(tp_input_zmq(NULL, NULL));
    tp_input_t *in = tp_input_zmq("bogus://nowhere", NULL);
    if (in) {  /* endpoints are checked when the socket is made */
        cr_assert_lt(tp_input_start(in, 1, 1, 0), 0);
        tp_input_destroy(&in);
    }
    cr_assert(strstr(tp_last_error(), "bogus://nowhere"), "%s", tp_last_error());
}

/* ---- training from it ------------------------------------------------- */

static tp_dataflow_t *s_blobs(int batch) { return tu_blobs(256, 2, 0.5f, 11, batch, 1, 0); }

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *logits = tp_fc(t, "fc", in[0], 2, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

Test(zmq_input, a_model_trains_from_a_sender, .init = s_setup, .fini = s_teardown) {
    tp_model_desc_t desc = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};
    zi_sender_t s = {.ep = s_ep, .df = s_blobs(16)};  /* endless until the input goes */
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &desc;
    c.input = s_input();
    cr_assert_not_null(c.input);
    c.towers = 2;
    c.batch = 16;
    c.max_epoch = 2;
    c.steps_per_epoch = 20;
    c.threads = 1;
    c.logdir = s_dir;
    c.save_checkpoints = 0;
    c.stats = "off";
    c.progress_names = "cost,accuracy";
    pthread_t th;
    s.count = 2 * 20 * 2;   /* exactly what training takes */
    pthread_create(&th, NULL, zi_send, &s);
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    pthread_join(th, NULL);
    cr_assert_eq(s.rc, TP_OK);
    char path[160];
    snprintf(path, sizeof path, "%s/stats.json", s_dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    json_t *last = json_array_get(j, json_array_size(j) - 1);
    cr_assert_eq(json_integer_value(json_object_get(last, "global_step")), 40);
    cr_assert_gt(json_real_value(json_object_get(last, "accuracy")), 0.9);
    json_decref(j);
    tp_dataflow_destroy(&s.df);
    tp_model_destroy(&m);
}

/* ---- actors of the run's own, under the training's supervisor ------------- */

typedef struct {
    atomic_int lives;
    int fail_life0_after;   /* life 0 fails after this many sends (-1: never) */
    int die_after_ms;       /* ... this long after its last send: the
                               trainer has taken every batch and waits */
} s_feed_spec_t;

typedef struct {
    s_feed_spec_t *spec;
    tp_dataflow_t *df;
    int life, sent;
} s_feed_t;

static tp_status_t s_feed_init(tp_actor_ctx_t *ctx, void *arg, void **state) {
    (void)ctx;
    s_feed_t *f = calloc(1, sizeof *f);
    f->spec = arg;
    f->life = atomic_fetch_add(&f->spec->lives, 1);
    f->df = s_blobs(16);
    tp_status_t rc = tp_dataflow_reset_state(f->df, 7 + (uint64_t)f->life, 0);
    *state = f;
    return rc;
}

static tp_status_t s_feed_produce(tp_actor_ctx_t *ctx, void *state) {
    s_feed_t *f = state;
    if (f->life == 0 && f->sent == f->spec->fail_life0_after) {
        usleep((useconds_t)f->spec->die_after_ms * 1000);
        return tp_error(TP_ERR_IO, "feeder: the bucket went away after %d batches",
                        f->sent);
    }
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_dataflow_next(f->df, &dp);
    if (rc == TP_DONE)  /* endless: the next call starts a new pass */
        rc = tp_dataflow_next(f->df, &dp);
    TP_TRY(rc);
    f->sent++;
    return tp_actor_send(ctx, 0, &dp);
}

static void s_feed_fini(void *state) {
    s_feed_t *f = state;
    tp_dataflow_destroy(&f->df);
    free(f);
}

static void s_zmq_config(tp_train_config_t *c, tp_model_desc_t *desc) {
    tp_train_config_init(c);
    c->model = desc;
    c->input = s_input();
    cr_assert_not_null(c->input);
    c->batch = 16;
    c->threads = 1;
    c->logdir = s_dir;
    c->save_checkpoints = 0;
    c->progress_names = "cost,accuracy";
}

Test(zmq_input, a_feeder_actor_is_restarted_under_its_policy, .init = s_setup,
     .fini = s_teardown) {
    tp_model_desc_t desc = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};
    /* it dies while the step waits for batch 16: restarted during the wait */
    s_feed_spec_t spec = {.fail_life0_after = 15, .die_after_ms = 300};
    tp_actor_port_t out = {"out", s_ep, 0, 0, 0};   /* connects: may restart */
    tp_actor_def_t def = {"feeder", NULL, 0, &out, 1, s_feed_init, NULL,
                          s_feed_produce, s_feed_fini};
    tp_train_actor_t actor = {&def, &spec, {2, 10}};
    tp_train_config_t c;
    s_zmq_config(&c, &desc);
    c.actors = &actor;
    c.nactors = 1;
    c.max_epoch = 2;
    c.steps_per_epoch = 20;
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    cr_assert_eq(atomic_load(&spec.lives), 2, "one restart");
    char path[160];
    snprintf(path, sizeof path, "%s/stats.json", s_dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    cr_assert_eq(json_array_size(j), 2, "both epochs");
    json_t *last = json_array_get(j, 1);
    cr_assert_eq(json_integer_value(json_object_get(last, "global_step")), 40);
    cr_assert_eq(json_real_value(json_object_get(last, "supervisor/restarts")), 1.0);
    cr_assert_gt(json_real_value(json_object_get(last, "accuracy")), 0.9);
    json_decref(j);
    tp_model_destroy(&m);
}

/* The feeder dies while the step waits for its next batch, and its policy
 * allows no restart: the wait ends at once with the supervisor's message
 * (the schedule's waits tick the supervisor), not after ZMQInput's 20 s. */
Test(zmq_input, a_feeder_dying_while_a_step_waits_ends_training_at_once,
     .init = s_setup, .fini = s_teardown) {
    tp_model_desc_t desc = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};
    s_feed_spec_t spec = {.fail_life0_after = 15, .die_after_ms = 300};
    tp_actor_port_t out = {"out", s_ep, 0, 0, 0};
    tp_actor_def_t def = {"feeder", NULL, 0, &out, 1, s_feed_init, NULL,
                          s_feed_produce, s_feed_fini};
    tp_train_actor_t actor = {&def, &spec, {0, 0}};
    tp_train_config_t c;
    s_zmq_config(&c, &desc);
    c.actors = &actor;
    c.nactors = 1;
    c.max_epoch = 1;
    c.steps_per_epoch = 100;
    double t0 = tp_now_s();
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_PEER, "%s", tp_last_error());
    cr_assert_lt(tp_now_s() - t0, 10.0, "the wait ended by the failure, not the timeout");
    const char *e = tp_last_error();
    cr_assert(strstr(e, "child 'feeder' failed: feeder: the bucket went away after 15 "
                        "batches (policy: fail at once)"), "%s", e);
}

/* A sidecar (no ports) that fails after about 60 ms, with no policy. */
static tp_status_t s_sidecar_init(tp_actor_ctx_t *ctx, void *arg, void **state) {
    (void)ctx;
    *state = arg;
    *(int *)arg = 0;
    return TP_OK;
}
static tp_status_t s_sidecar_produce(tp_actor_ctx_t *ctx, void *state) {
    (void)ctx;
    usleep(2000);
    if (++*(int *)state == 30)
        return tp_error(TP_ERR_IO, "exporter: connection to the dashboard lost");
    return TP_OK;
}

Test(zmq_input, a_child_failing_beyond_its_policy_ends_training, .init = s_setup,
     .fini = s_teardown) {
    tp_model_desc_t desc = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};
    s_feed_spec_t spec = {.fail_life0_after = -1};
    tp_actor_port_t out = {"out", s_ep, 0, 0, 0};
    tp_actor_def_t feeder = {"feeder", NULL, 0, &out, 1, s_feed_init, NULL,
                             s_feed_produce, s_feed_fini};
    int calls = 0;
    tp_actor_def_t sidecar = {"exporter", NULL, 0, NULL, 0, s_sidecar_init, NULL,
                              s_sidecar_produce, NULL};
    tp_train_actor_t actors[] = {{&feeder, &spec, {0, 0}}, {&sidecar, &calls, {0, 0}}};
    tp_train_config_t c;
    s_zmq_config(&c, &desc);
    c.actors = actors;
    c.nactors = 2;
    c.max_epoch = 1000000;
    c.steps_per_epoch = 20;
    double t0 = tp_now_s();
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_PEER);
    /* ended by the failure: a million epochs would take hours. The steps
     * stop at the boundary after it, but the launch returns once the
     * observing callbacks have worked through the epoch ends queued before
     * (each renders curves.png): 7-17 epochs' worth alone, 74 (10 s) once
     * under ASan beside another test. Hence 60 s, not 10. */
    cr_assert_lt(tp_now_s() - t0, 60.0);
    const char *e = tp_last_error();
    cr_assert(strstr(e, "child 'exporter' failed: exporter: connection to the "
                        "dashboard lost") && strstr(e, "fail at once"), "%s", e);
    cr_assert_eq(atomic_load(&spec.lives), 1);
}
