/* towerpack tests: a forked peer that pushes to a remote dataflow what a
 * test makes it (raw frames, half messages), then one good datapoint that
 * shows the receiver still works. Include after Criterion. */
#ifndef TP_TESTS_REMOTE_TESTUTIL_H
#define TP_TESTS_REMOTE_TESTUTIL_H

#include <unistd.h>
#include <zmq.h>
#include <towerpack/wire.h>
#include "actor_testutil.h"

/* In the child: a PUSH socket, in a context of its own, connected to ep. */
static inline void *ru_push_connect(const char *ep, void **ctx) {
    *ctx = zmq_ctx_new();
    void *push = zmq_socket(*ctx, ZMQ_PUSH);
    zmq_connect(push, ep);
    return push;
}

/* In the child: the datapoint tu_dp(value, pad) sent last, up to 2 s for it
 * to leave, and the child's end. */
static inline void ru_push_last_and_exit(void *ctx, void *push, int64_t value,
                                         size_t pad) {
    tp_datapoint_t *dp = tu_dp(value, pad);
    tp_wire_send(push, &dp, NULL);
    int linger = 2000;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(push);
    zmq_ctx_term(ctx);
    _exit(0);
}

#endif
