/* towerpack security: ZeroMQ CURVE on the tcp endpoints (remote dataflows,
 * tp-worker, the stats socket), and the rules every bind follows.
 *
 * Keys. `tp-keygen DIR` (tp_curve_keygen) makes a key directory, mode 0700:
 *   DIR/server.key, DIR/server.key_secret   the binding side's certificate
 *   DIR/client.key, DIR/client.key_secret   the connecting side's certificate
 * (czmq's zcert text format). The same directory is copied to every host
 * of a run. The side that binds is the CURVE server: it proves itself with
 * server.key_secret and lets in only peers that prove client.key (a ZAP
 * handler checks every handshake). The side that connects is the CURVE
 * client: client.key_secret, and it talks only to the holder of
 * server.key_secret. A peer without the directory gets nothing in and
 * nothing out: its handshake fails and no message crosses. Secret files
 * readable by group or others are refused.
 *
 * Binds. A tcp bind to every interface (tcp://\*:P, tcp://0.0.0.0:P,
 * tcp://[::]:P) is refused unless the caller allows it explicitly (the
 * tools' --public flag); tcp://:P means loopback. ipc socket files are made
 * mode 0600 right after the bind (Linux needs write permission on the
 * file to connect), and the private run directories are 0700. */
#ifndef TOWERPACK_SECURITY_H
#define TOWERPACK_SECURITY_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when libzmq was built with CURVE (libsodium), else 0. */
int tp_curve_available(void);

/* Make the key directory `dir` (created mode 0700 when absent; an existing
 * one must not be accessible by group or others) with fresh server and
 * client certificates. Refuses to overwrite existing keys. */
tp_status_t tp_curve_keygen(const char *dir);

typedef struct tp_curve tp_curve_t;

/* Load the keys of `dir` for one side: server (binds) or client
 * (connects). Checks that the secret file is not readable by group or
 * others. Caller owns; NULL with tp_last_error() naming the file. */
tp_curve_t *tp_curve_load(const char *dir, int server);

/* Make `sock` (a raw libzmq socket of context zctx, before its bind or
 * connect) a CURVE server or client with c's keys. For a server, the ZAP
 * handler of zctx is started on the first call (one per context, bound to
 * inproc://zeromq.zap.01); it ends when zctx is terminated. */
tp_status_t tp_curve_apply(tp_curve_t *c, void *zctx, void *sock);

/* A client's keys (tp_curve_load(dir, 0)) as binaries: its public key,
 * its secret key and the server's public key, 32 bytes each, for a CURVE
 * handshake made by hand (tp_wire_probe_job_curve, towerpack/wire.h).
 * TP_ERR_INVALID for a server's. */
tp_status_t tp_curve_client_keys(const tp_curve_t *c, uint8_t keys[96]);

/* Free c; after zmq_ctx_term of the contexts it served (joins their ZAP
 * thread). NULL-safe; nulls *c. */
void tp_curve_destroy(tp_curve_t **c);

/* CURVE for the stats sockets of this process (tp_stats_pub_new binds
 * as a CURVE server with the keys of dir; NULL turns it off). */
tp_status_t tp_stats_set_curve(const char *dir);

/* The bind rule: copy endpoint into out, with "tcp://:P" made
 * "tcp://127.0.0.1:P"; a tcp bind to every interface is an error naming the
 * endpoint unless allow_public. */
tp_status_t tp_bind_endpoint(const char *endpoint, int allow_public, char *out,
                             size_t size);

/* What a failed bind of endpoint with errno `err` (zmq_errno()) means,
 * as " (...)" to follow the system's words, or "" when there is nothing to
 * add: a tcp host that is no address of this machine (libzmq's ENODEV, "No
 * such device"; EADDRNOTAVAIL), a port another process holds, a privileged port, an ipc
 * path whose folder does not exist or may not be written. Static text. */
const char *tp_bind_why(const char *endpoint, int err);

/* The permission for binds that have no flag of their own (the stats
 * sockets): off by default; the tools' --public turns it on. */
void tp_bind_set_public(int on);
int tp_bind_public(void);

/* After binding an ipc endpoint: make its file mode 0600 (no-op for other
 * transports). */
void tp_ipc_restrict(const char *endpoint);

#ifdef __cplusplus
}
#endif
#endif
