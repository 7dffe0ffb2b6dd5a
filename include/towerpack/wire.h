/* towerpack: the wire format for datapoints that cross a process or host.
 *
 * A datapoint travels as one ZeroMQ multipart message: a small header frame
 * followed by one frame per component. Component frames are sent zero-copy
 * from the datapoint's own buffers (the datapoint is freed when ZeroMQ has
 * sent the last of them), optionally lz4-compressed. The header layout is in
 * docs/wire-format.md.
 *
 * Decoding validates the whole message before it trusts any of it: every
 * malformed message is TP_ERR_PROTOCOL with a message saying what was wrong,
 * and no allocation is ever sized by a peer's claim before that claim is
 * checked against the frames received and opts->max_bytes. */
#ifndef TOWERPACK_WIRE_H
#define TOWERPACK_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/datapoint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_WIRE_MAGIC 0x31575054u   /* "TPW1", little-endian */
#define TP_WIRE_VERSION 1
#define TP_WIRE_FLAG_CHECKSUM 0x01u
#define TP_WIRE_CODEC_NONE 0
#define TP_WIRE_CODEC_LZ4 1

typedef struct tp_wire_opts {
    int lz4;               /* encode: try lz4 on components >= lz4_min_bytes */
    size_t lz4_min_bytes;  /* default 1024 */
    int checksum;          /* encode: CRC32 of each component's raw bytes */
    size_t max_bytes;      /* decode: largest total raw size (default 1 GiB) */
} tp_wire_opts_t;

/* Defaults: no lz4, no checksum, 1 GiB limit. */
void tp_wire_opts_init(tp_wire_opts_t *opts);

/* A message: an ordered list of frames. */
typedef struct tp_wire_msg tp_wire_msg_t;

/* An empty message. Caller owns; NULL on out of memory. */
tp_wire_msg_t *tp_wire_msg_new(void);
/* Close every frame and free; accepts NULL, nulls *self_p. */
void tp_wire_msg_destroy(tp_wire_msg_t **self_p);
/* Close every frame, keep the message for reuse. */
void tp_wire_msg_clear(tp_wire_msg_t *self);
int tp_wire_msg_frames(const tp_wire_msg_t *self);
const void *tp_wire_msg_frame_data(tp_wire_msg_t *self, int i);
size_t tp_wire_msg_frame_size(tp_wire_msg_t *self, int i);
/* The connection (its file descriptor) frame i came in on, for ipc and tcp
 * (libzmq's ZMQ_SRCFD); -1 for inproc or when unknown. */
int tp_wire_msg_frame_srcfd(tp_wire_msg_t *self, int i);
/* Where frame i's sender is, as libzmq read it when the connection was
 * made (so still right after it closed): its IP address for tcp
 * ("10.0.0.2"), "HOST:UID:GID:PID" for ipc; NULL for inproc or when
 * unknown. Valid while the frame is. */
const char *tp_wire_msg_frame_peer(tp_wire_msg_t *self, int i);
/* Total bytes over all frames. */
size_t tp_wire_msg_bytes(tp_wire_msg_t *self);
/* Move frame i out of the message (it is left empty there): *data and
 * *size describe it, and release(*data, *hint) frees it, from any thread.
 * NULL release on out of memory. For decoders that keep the frame as the
 * memory of what they decode (tensorpack's single-frame messages). */
tp_status_t tp_wire_msg_take_frame(tp_wire_msg_t *self, int i, void **data,
                                   size_t *size, tp_free_fn *release, void **hint);
/* Append a copy of `size` bytes as a new frame (tests, fuzzing). */
tp_status_t tp_wire_msg_add_frame(tp_wire_msg_t *self, const void *data,
                                  size_t size);

/* Encode *dp_p into `msg` (cleared first). Takes the datapoint and nulls
 * *dp_p, also on failure (then it is freed). Frames reference the
 * datapoint's buffers; it is freed once every frame is released. */
tp_status_t tp_wire_encode(tp_datapoint_t **dp_p, const tp_wire_opts_t *opts,
                           tp_wire_msg_t *msg);

/* Decode `msg` into a new datapoint in *out (caller owns). Consumes the
 * frames (msg is empty afterwards, also on failure). Large uncompressed
 * components keep the received frame as their memory: no copy. */
tp_status_t tp_wire_decode(tp_wire_msg_t *msg, const tp_wire_opts_t *opts,
                           tp_datapoint_t **out);

/* Send every frame of `msg` on a raw libzmq socket (zsock_resolve() of a
 * czmq socket). flags: 0 blocks, ZMQ_DONTWAIT gives TP_ERR_TIMEOUT when the
 * peer is full, with msg untouched so the caller may retry. On success msg
 * is empty. TP_ERR_INTERRUPTED when the context is terminated or a signal
 * arrives. */
tp_status_t tp_wire_msg_send(tp_wire_msg_t *msg, void *socket, int flags);

/* Receive one whole multipart message into `msg` (cleared first). flags as
 * above (TP_ERR_TIMEOUT when nothing is there, or the socket's RCVTIMEO ran
 * out). A message of more than TP_DP_MAX_COMPONENTS + 1 frames is read to
 * its end, dropped, and reported as TP_ERR_PROTOCOL. */
tp_status_t tp_wire_msg_recv(tp_wire_msg_t *msg, void *socket, int flags);

/* Encode and send in one call (blocking). Takes *dp_p. */
tp_status_t tp_wire_send(void *socket, tp_datapoint_t **dp_p,
                         const tp_wire_opts_t *opts);

/* Receive and decode in one call (blocking, honours RCVTIMEO). */
tp_status_t tp_wire_recv(void *socket, const tp_wire_opts_t *opts,
                         tp_datapoint_t **out);

/* ---- control frames -------------------------------------------------------
 * A one-frame message that is not a datapoint: "TCL1", kind, 3 zero bytes,
 * u32 sender index, then UTF-8 text (no NUL). Sent on the same sockets as
 * the data, so it keeps its place in the stream. */
#define TP_CTL_MAGIC 0x314C4354u /* "TCL1" */
#define TP_CTL_HEADER 12
enum { TP_CTL_EOS = 1, TP_CTL_ERROR = 2, TP_CTL_END_PASS = 3, TP_CTL_PAD = 4,
       TP_CTL_STATS = 5 /* a worker's counters: "busy_ns blocked_ns ..."
                            (df_process.c; a 6th, bad image files) */,
       TP_CTL_REPORT = 6 /* a remote sender's row (tp_send_dataflow): tab-
                            separated "pid host name state alive_ns busy_ns
                            blocked_ns starved_ns msgs bytes" */ };

/* Send TP_CTL_PAD_BYTES of padding (a TP_CTL_PAD frame receivers skip)
 * after the last message of a stream, before closing an ipc/tcp socket.
 * libzmq 4.3 can close a connection with the end of its send buffer still
 * unwritten when the peer is slow (libzmq issue #4763): what is lost then
 * is this padding, not the stream's last messages. */
#define TP_CTL_PAD_BYTES (256 * 1024)
int tp_ctl_send_pad(void *sock, int flags);

/* Send a control frame on a raw libzmq socket (flags as zmq_send). */
int tp_ctl_send(void *sock, int kind, uint32_t sender, const char *text,
                int flags);
/* 1 when data/size is a well-formed control frame (fills the outputs; text
 * is not terminated, *text_len bytes). */
int tp_ctl_parse(const void *data, size_t size, int *kind, uint32_t *sender,
                 const char **text, size_t *text_len);

/* ---- the job handshake (core/wire_job.c) ---------------------------------
 * A sender and a receiver of one training job carry the same job id: a ZMTP
 * property of their sockets ("X-Tp-Job", sent by libzmq in the handshake of
 * every connection, reconnections included), so a receiver reads the
 * sender's id on each message it gets, and a connecting sender reads the
 * receiver's with a probe (one short connection of its own: a PUSH socket
 * never receives). A side without an id accepts every peer (tensorpack's
 * senders have none). docs/wire-format.md. */
#define TP_WIRE_JOB_PROPERTY "X-Tp-Job"
#define TP_WIRE_JOB_MAX 64  /* an id is 1..63 printable ASCII, no space */

/* 1 when `job` is a usable id (1..63 bytes of 0x21..0x7e, no ':'). */
int tp_wire_job_ok(const char *job);

/* Give `socket` (raw libzmq, before its bind or connect) the job id that
 * its connections carry. TP_ERR_INVALID for a bad id, TP_ERR_UNSUPPORTED
 * when this libzmq has no ZMQ_METADATA. */
tp_status_t tp_wire_set_job(void *socket, const char *job);

/* The job id of the sender of frame i (its connection's property), or
 * NULL when it gave none. Valid while the frame is. */
const char *tp_wire_msg_frame_job(tp_wire_msg_t *self, int i);

/* Who a towerpack sender is, in its handshake: the text of its first
 * report (TP_CTL_REPORT: pid, host, name, addresses), so that a receiver
 * names it from its first message on, refused or not. */
#define TP_WIRE_SENDER_PROPERTY "X-Tp-Sender"

/* The value of property `name` ("X-...") of the connection frame i came
 * in on, or NULL when its sender gave none. Valid while the frame is. */
const char *tp_wire_msg_frame_property(tp_wire_msg_t *self, int i, const char *name);

/* The host and port of a tcp://HOST:PORT endpoint: HOST (an IPv6
 * address's brackets dropped) into host[size], *port into ep. 0, or -1
 * for another transport, an interface or source part (';'), a host longer
 * than size. */
int tp_wire_tcp_host(const char *ep, char *host, size_t size, const char **port);

/* Ask the receiver bound at `endpoint` (tcp://HOST:PORT or ipc://PATH)
 * for its job id: a ZMTP 3 handshake as a PUSH socket with the NULL
 * mechanism, the receiver's READY read, the connection closed. TP_OK with
 * its id in job (an empty string when it has none); TP_ERR_UNSUPPORTED
 * for other endpoints and for a receiver with another mechanism (with
 * CURVE, tp_wire_probe_job_curve below); TP_ERR_TIMEOUT, TP_ERR_IO or TP_ERR_PROTOCOL
 * with a message otherwise. Waits at most timeout_ms in all. */
tp_status_t tp_wire_probe_job(const char *endpoint, int timeout_ms, char *job,
                              size_t size);

/* The same with CURVE (a receiver with keys): the handshake as the run's
 * client, keys = its public key, its secret key and the server's public
 * key (32 bytes each; tp_curve_client_keys of towerpack/security.h). */
tp_status_t tp_wire_probe_job_curve(const char *endpoint, int timeout_ms,
                                    const uint8_t keys[96], char *job, size_t size);

/* ---- the component handshake (core/wire_job.c) ----------------------------
 * A receiver that knows what it takes (a trainer: its model's inputs)
 * carries it as a second property of the same handshake, "X-Tp-Comps":
 * "NAME:DTYPE[D0,D1,...];..." in order, '*' for a size it does not fix
 * ("image:uint8[64,28,28];label:int32[64]"; a scalar is "NAME:DTYPE[]"),
 * and after an integer component's shape the values it takes, "{LO..HI}"
 * ("label:int32[64]{0..9}": a model's 10 classes).
 * A connecting sender reads it with the probe and checks every datapoint
 * before it sends it: one that does not fit ends the sender at once with a
 * message naming the receiver, the component, what the receiver takes and
 * what the sender has, and the sender tells the receiver why it ends (a
 * TP_CTL_ERROR frame), so that both logs name both sides. */
#define TP_WIRE_COMPS_PROPERTY "X-Tp-Comps"
#define TP_WIRE_COMPS_MAX 1024   /* the property's text, NUL included */
#define TP_WIRE_COMPS_N 16       /* components at most */

typedef struct tp_wire_comp {
    char name[32];               /* for messages: [A-Za-z0-9_.-] (others '_') */
    tp_dtype_t dtype;
    int ndim;                    /* 0..TP_MAX_DIMS */
    int64_t shape[TP_MAX_DIMS];  /* shape[0..ndim-1]; < 0: any size there */
    int ranged;                  /* 1: every value lies in lo..hi (integer dtypes) */
    int64_t lo, hi;
} tp_wire_comp_t;

/* The text of n components into out (size bytes); its length, or -1 when
 * it does not fit (TP_WIRE_COMPS_MAX always does for TP_WIRE_COMPS_N). */
int tp_wire_comps_format(const tp_wire_comp_t *comps, int n, char *out, size_t size);

/* Components from text (a peer's: every field checked); their number
 * (0..max), or -1 when malformed. */
int tp_wire_comps_parse(const char *text, tp_wire_comp_t *comps, int max);

/* 0 when dp has the n components `want` (dtype, rank and every fixed
 * size, then the values of the ranged ones); else -1 with the first
 * mismatch in why: "component 0 'image' is float32[64,28,28], expected
 * uint8[64,28,28]", for a missing or extra component "1 component
 * (uint8[64,28,28]), expected 2: image uint8[64,28,28], label int32[64]",
 * for a value out of range "component 1 'label' has value 12 at [3],
 * expected 0..9". */
int tp_wire_comps_check(const tp_wire_comp_t *want, int n, const tp_datapoint_t *dp,
                        char *why, size_t size);

/* Give `socket` (raw libzmq, before its bind or connect) the components
 * text its connections carry. TP_ERR_INVALID for a text that does not
 * parse, TP_ERR_UNSUPPORTED as tp_wire_set_job. */
tp_status_t tp_wire_set_comps(void *socket, const char *text);

/* What the probe reads of a receiver: its job id and its components
 * (empty strings where it gives none). */
typedef struct tp_wire_peer {
    char job[TP_WIRE_JOB_MAX];
    char comps[TP_WIRE_COMPS_MAX];
} tp_wire_peer_t;

/* tp_wire_probe_job and tp_wire_probe_job_curve in one (keys NULL: the
 * NULL mechanism), with every property this handshake carries. */
tp_status_t tp_wire_probe_peer(const char *endpoint, int timeout_ms, const uint8_t *keys,
                               tp_wire_peer_t *peer);

/* tp_wire_probe_peer at one address of a tcp:// endpoint's host
 * (addr[addrlen], an IPv4 or IPv6 struct sockaddr, as getaddrinfo gives
 * it): no name is looked up, so nothing blocks on a resolver; endpoint
 * names the receiver in the errors. TP_ERR_INVALID for an address of
 * another family or another transport's endpoint. */
struct sockaddr;
tp_status_t tp_wire_probe_peer_at(const char *endpoint, const struct sockaddr *addr,
                                  size_t addrlen, int timeout_ms, const uint8_t *keys,
                                  tp_wire_peer_t *peer);

#ifdef __cplusplus
}
#endif
#endif
