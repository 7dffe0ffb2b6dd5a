/* towerpack tests: the two ends of a remote dataflow, for the suites that
 * test it (test_proc_remote, test_proc_fault_remote): the receiver, a
 * forked sender of counted datapoints, and a forked peer that pushes what
 * a test makes it (raw frames, half messages), then one good datapoint that
 * shows the receiver still works. */
#ifndef TP_TESTS_REMOTE_TESTUTIL_H
#define TP_TESTS_REMOTE_TESTUTIL_H

#include <criterion/criterion.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/wire.h>
#include "actor_testutil.h"
#include "proc_testutil.h"

/* A remote dataflow receiving at eps (comma-separated), a receive given up
 * after `timeout` s, that checks every datapoint against e[0..n)
 * (tp_df_remote_expect; n 0: none) and ends when no sender that may fit is
 * left for `grace` s (0: the default); reset and ready, the test fails
 * here if it is not. */
static inline tp_dataflow_t *ru_remote_expecting(const char *eps, double timeout,
                                                 const tp_remote_expect_t *e, int n,
                                                 double grace) {
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    o.timeout_s = timeout;
    if (grace > 0)
        o.unfit_grace_s = grace;
    tp_dataflow_t *df = tp_df_remote(eps, &o);
    cr_assert(df, "%s", tp_last_error());
    if (n)
        cr_assert_eq(tp_df_remote_expect(df, e, n), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    return df;
}

/* The same, checking nothing. */
static inline tp_dataflow_t *ru_remote(const char *eps, double timeout) {
    return ru_remote_expecting(eps, timeout, NULL, 0, 0);
}

/* Forks a sender of n datapoints tu_count_df(n, pad) (values 0..n-1) to
 * ep, as stream `stream`, lz4-compressed or not, `hwm` messages queued at
 * most (0: the default); it starts sending when `gate` opens (NULL: at
 * once). Senders are forked before the receiver exists (pu_fork's rule);
 * the gate opens once it is bound. Its pid; it exits 0 when all went, 3
 * when the send failed. */
static inline pid_t ru_fork_sender(const char *ep, int64_t n, uint64_t stream, size_t pad,
                                   int lz4, int hwm, pu_gate_t *gate) {
    pid_t pid = pu_fork();
    if (pid == 0) {
        if (gate)
            pu_gate_wait(gate);
        tp_dataflow_t *df = tu_count_df(n, pad, -1);
        tp_send_opts_t o;
        tp_send_opts_init(&o);
        o.max_count = n;
        o.stream = stream;
        o.lz4 = lz4;
        if (hwm)
            o.hwm = hwm;
        tp_status_t rc = tp_send_dataflow(df, ep, &o, NULL);
        tp_dataflow_destroy(&df);
        _exit(rc == TP_OK ? 0 : 3);
    }
    return pid;
}

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
