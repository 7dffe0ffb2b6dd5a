/* tp-worker: run a dataflow and send it to an endpoint (tensorpack's
 * send_dataflow_zmq as a program). The dataflow comes from a pipeline spec
 * (--spec) or from a user plugin: a shared library exporting
 *   tp_status_t tp_worker_dataflow(int argc, char **argv, tp_dataflow_t **out)
 * (towerpack/actor_dataflow.h), loaded with dlopen and given the
 * --plugin-arg values. SIGINT and SIGTERM end it cleanly; so does its
 * trainer's end (--exit-with-trainer), and a failed handshake with the
 * trainer (CURVE keys, a trainer of another --job) ends it with an error,
 * as does a datapoint that the trainer it connects to does not take (the
 * component handshake: the trainer's model inputs, read at connect). */
#include <dlfcn.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "tools/tp-worker/worker_spec.h"

static void s_usage(FILE *out) {
    fprintf(out,
        "usage: tp-worker (--spec SPEC | --plugin LIB.so [--plugin-arg ARG]...)\n"
        "                 (--connect ENDPOINT | --bind ENDPOINT) [options]\n"
        "Run a dataflow and PUSH its datapoints (wire format) to ENDPOINT\n"
        "(tcp://HOST:PORT or ipc://PATH), pass after pass, until --count or a\n"
        "signal. A receiver reads them with the spec source remote:ENDPOINT or\n"
        "tp_df_remote(). Connecting, it reads what the receiver takes (a\n"
        "trainer's model inputs) before its first datapoint goes, and ends\n"
        "(exit 1) at one that does not fit, naming both sides.\n"
        "\n"
        "  --spec SPEC           a pipeline spec (see docs/dataflow.md)\n"
        "  --plugin LIB.so       a shared library exporting %s\n"
        "  --plugin-arg ARG      an argument for the plugin's factory (repeatable)\n"
        "  --connect ENDPOINT    connect to a receiver that binds (default)\n"
        "  --bind ENDPOINT       bind, receivers connect\n"
        "  --lz4                 lz4-compress components\n"
        "  --format FMT          towerpack (the wire format, default), tensorpack\n"
        "                        (a pickle per datapoint: what tensorpack's\n"
        "                        RemoteDataZMQ reads by default), tensorpack-msgpack\n"
        "                        (TENSORPACK_SERIALIZE=msgpack) or zmq_ops\n"
        "  --hwm N               datapoints queued before the sender waits (50)\n"
        "  --count N             stop after N datapoints (default: endless)\n"
        "  --seed N              seed for the dataflow's RNG (0)\n"
        "  --stats ENDPOINT      publish statistics for tp-top: ipc (in --run-dir),\n"
        "                        tcp, tcp:PORT (loopback), or a full address\n"
        "  --run-dir DIR         where an ipc stats socket goes (default: .)\n"
        "  --curve DIR           CURVE keys made by tp-keygen DIR: authenticate and\n"
        "                        encrypt the data (and a tcp stats socket)\n"
        "  --public              allow --bind (or --stats) to every interface\n"
        "                        (tcp://*:P); by default only given addresses\n"
        "  --exit-with-trainer[=S]  end (exit 0) once the trainer has been gone\n"
        "                        for S seconds (default on, S = 10): no leftover\n"
        "                        worker joins the next run on the same port\n"
        "  --no-exit-with-trainer   keep sending for any later receiver\n"
        "  --job ID              the job this worker is for (default: $TP_JOB): a\n"
        "                        trainer of another job refuses it, and it ends\n"
        "                        (exit 1) naming both ids\n"
        "  --log-level LEVEL     debug, info, warn, error (default info)\n"
        "  -h, --help            this text\n",
        TP_WORKER_FACTORY);
}

static int s_fail(const char *what) {
    fprintf(stderr, "tp-worker: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"spec", required_argument, 0, 's'},
        {"plugin", required_argument, 0, 'p'},
        {"plugin-arg", required_argument, 0, 'a'},
        {"connect", required_argument, 0, 'c'},
        {"bind", required_argument, 0, 'b'},
        {"lz4", no_argument, 0, 'z'},
        {"hwm", required_argument, 0, 'w'},
        {"count", required_argument, 0, 'n'},
        {"seed", required_argument, 0, 'S'},
        {"stats", required_argument, 0, 't'},
        {"run-dir", required_argument, 0, 'r'},
        {"log-level", required_argument, 0, 'l'},
        {"curve", required_argument, 0, 'k'},
        {"public", no_argument, 0, 'P'},
        {"format", required_argument, 0, 'F'},
        {"exit-with-trainer", optional_argument, 0, 'E'},
        {"no-exit-with-trainer", no_argument, 0, 'N'},
        {"job", required_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *spec = NULL, *plugin = NULL, *connect_ep = NULL, *bind_ep = NULL;
    char *pargv[64];
    int pargc = 1;
    tp_send_opts_t so;
    tp_send_opts_init(&so);
    so.stats_name = "tp-worker";
    so.peer_gone_s = 10;  /* --exit-with-trainer */
    char cwd[512] = ".";
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 's': spec = optarg; break;
        case 'p': plugin = optarg; break;
        case 'a':
            if (pargc >= 63) {
                fprintf(stderr, "tp-worker: more than 62 --plugin-arg values\n");
                return 2;
            }
            pargv[pargc++] = optarg;
            break;
        case 'c': connect_ep = optarg; break;
        case 'b': bind_ep = optarg; break;
        case 'z': so.lz4 = 1; break;
        case 'F':
            if (!strcmp(optarg, "towerpack"))
                so.tpk_format = 0;
            else if (!strcmp(optarg, "tensorpack") || !strcmp(optarg, "tensorpack-pickle"))
                so.tpk_format = TP_TPK_PICKLE;
            else if (!strcmp(optarg, "tensorpack-msgpack"))
                so.tpk_format = TP_TPK_MSGPACK;
            else if (!strcmp(optarg, "zmq_ops"))
                so.tpk_format = TP_TPK_ZMQ_OPS;
            else {
                fprintf(stderr, "tp-worker: --format '%s': towerpack, tensorpack, "
                        "tensorpack-msgpack or zmq_ops\n", optarg);
                return 2;
            }
            break;
        case 'w':
            so.hwm = (int)strtol(optarg, &end, 10);
            if (*end || so.hwm <= 0) {
                fprintf(stderr, "tp-worker: --hwm '%s' is not a positive integer\n", optarg);
                return 2;
            }
            break;
        case 'n':
            so.max_count = strtoll(optarg, &end, 10);
            if (*end || so.max_count <= 0) {
                fprintf(stderr, "tp-worker: --count '%s' is not a positive integer\n", optarg);
                return 2;
            }
            break;
        case 'S':
            so.seed = strtoull(optarg, &end, 10);
            if (*end) {
                fprintf(stderr, "tp-worker: --seed '%s' is not a number\n", optarg);
                return 2;
            }
            break;
        case 't': so.stats = optarg; break;
        case 'r': so.run_dir = optarg; break;
        case 'k': so.curve_dir = optarg; break;
        case 'E':
            if (optarg) {
                so.peer_gone_s = strtod(optarg, &end);
                if (*end || !(so.peer_gone_s > 0)) {
                    fprintf(stderr, "tp-worker: --exit-with-trainer=%s: seconds > 0\n", optarg);
                    return 2;
                }
            } else {
                so.peer_gone_s = 10;
            }
            break;
        case 'N': so.peer_gone_s = 0; break;
        case 'j': so.job = optarg; break;
        case 'P': so.allow_public = 1; tp_bind_set_public(1); break;
        case 'l': {
            tp_log_level_t lv;
            if (tp_log_level_parse(optarg, &lv) < 0) {
                fprintf(stderr, "tp-worker: %s\n", tp_last_error());
                return 2;
            }
            tp_log_set_level(lv);
            break;
        }
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tp-worker: unexpected argument '%s'\n", argv[optind]);
        s_usage(stderr);
        return 2;
    }
    if (!!spec + !!plugin != 1) {
        fprintf(stderr, "tp-worker: give exactly one of --spec and --plugin\n");
        s_usage(stderr);
        return 2;
    }
    if (!!connect_ep + !!bind_ep != 1) {
        fprintf(stderr, "tp-worker: give exactly one of --connect and --bind\n");
        s_usage(stderr);
        return 2;
    }
    if (!plugin && pargc > 1) {
        fprintf(stderr, "tp-worker: --plugin-arg needs --plugin\n");
        return 2;
    }
    if (!so.job && getenv("TP_JOB") && *getenv("TP_JOB"))
        so.job = getenv("TP_JOB");
    if (so.job && !tp_wire_job_ok(so.job)) {
        fprintf(stderr, "tp-worker: --job '%s': 1 to %d printable characters, no space "
                "or ':'\n", so.job, TP_WIRE_JOB_MAX - 1);
        return 2;
    }
    if (so.stats && !so.run_dir && getcwd(cwd, sizeof cwd))
        so.run_dir = cwd;
    if (so.curve_dir && so.stats && tp_stats_set_curve(so.curve_dir) < 0)
        return s_fail(tp_last_error());

    tp_dataflow_t *df = NULL;
    void *lib = NULL;
    if (spec) {
        if (tp_worker_spec_dataflow(spec, &df) < 0)
            return s_fail(tp_last_error());
    } else {
        lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "tp-worker: cannot load plugin %s: %s\n", plugin, dlerror());
            return 1;
        }
        tp_worker_factory_fn factory;
        *(void **)&factory = dlsym(lib, TP_WORKER_FACTORY);
        if (!factory) {
            fprintf(stderr, "tp-worker: plugin %s does not export %s()\n", plugin,
                    TP_WORKER_FACTORY);
            dlclose(lib);
            return 1;
        }
        pargv[0] = (char *)plugin;
        pargv[pargc] = NULL;
        tp_clear_error();
        tp_status_t rc = factory(pargc, pargv, &df);
        if (rc < 0 || !df) {
            fprintf(stderr, "tp-worker: plugin %s: %s() failed: %s\n", plugin,
                    TP_WORKER_FACTORY, *tp_last_error() ? tp_last_error() : tp_strerror(rc));
            dlclose(lib);
            return 1;
        }
    }
    if (tp_signals_install() < 0)
        return s_fail(tp_last_error());
    so.bind = bind_ep != NULL;
    const char *ep = bind_ep ? bind_ep : connect_ep;
    TP_INFO("tp-worker: sending dataflow '%s' to %s (%s)%s%s", tp_dataflow_name(df), ep,
            so.bind ? "bind" : "connect", so.job ? " for job " : "", so.job ? so.job : "");
    uint64_t sent = 0;
    double t0 = tp_now_s();
    tp_status_t rc = tp_send_dataflow(df, ep, &so, &sent);
    double dt = tp_now_s() - t0;
    int code = 0;
    if (rc == TP_ERR_INTERRUPTED) {
        TP_INFO("tp-worker: stopped by %s after %llu datapoints (%.1f/s)",
                tp_signal_pending() == 15 ? "SIGTERM" : "SIGINT",
                (unsigned long long)sent, dt > 0 ? sent / dt : 0.0);
    } else if (rc == TP_DONE) {  /* --exit-with-trainer */
        TP_INFO("tp-worker: %s (--exit-with-trainer): ending after %llu datapoints",
                tp_last_error(), (unsigned long long)sent);
    } else if (rc < 0) {
        fprintf(stderr, "tp-worker: %s\n", tp_last_error());
        code = 1;
    } else {
        TP_INFO("tp-worker: sent %llu datapoints in %.2f s", (unsigned long long)sent, dt);
    }
    tp_dataflow_destroy(&df);
    tp_signals_restore();
    /* Keep the plugin mapped: its code may still be referenced by frees
     * that ZeroMQ runs at exit. */
    (void)lib;
    return code;
}
