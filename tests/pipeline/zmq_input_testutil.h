/* towerpack tests: the sending side of a ZMQInput, for the suites that feed
 * one (test_input_zmq, test_input_stats): a thread that sends a dataflow
 * to the input's endpoint, after a message that is not the wire format
 * when the test asks for one. */
#ifndef TP_TESTS_ZMQ_INPUT_TESTUTIL_H
#define TP_TESTS_ZMQ_INPUT_TESTUTIL_H

#include <string.h>
#include <zmq.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/towerpack.h>

typedef struct {
    const char *ep;            /* the input's endpoint */
    const char *const *junk;   /* the frames of one message that is not the
                                  wire format, sent first (NULL-ended; NULL:
                                  none) */
    tp_dataflow_t *df;
    int64_t count;             /* datapoints to send; 0: until the input goes */
    tp_status_t rc;            /* tp_send_dataflow's */
} zi_sender_t;

/* A sender thread's body (pthread_create(..., zi_send, s)): s->junk, then
 * s->count datapoints of s->df. */
static inline void *zi_send(void *arg) {
    zi_sender_t *s = arg;
    if (s->junk) {
        void *ctx = zmq_ctx_new(), *push = zmq_socket(ctx, ZMQ_PUSH);
        zmq_connect(push, s->ep);
        for (const char *const *f = s->junk; *f; f++)
            zmq_send(push, *f, strlen(*f), f[1] ? ZMQ_SNDMORE : 0);
        int linger = 2000;
        zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(push);
        zmq_ctx_term(ctx);
    }
    tp_send_opts_t o;
    tp_send_opts_init(&o);
    o.max_count = s->count;
    s->rc = tp_send_dataflow(s->df, s->ep, &o, NULL);
    return NULL;
}

#endif
