/* What every unit of a connection shares: its state (struct fb_conn and its
 * channels), its constants, and the primitives of conn_state.c (the
 * channel tables, the control queue, waking the writer, references).
 *
 * The units, each with the header that says what it exports and to whom,
 * from the bottom up (a unit calls only units below it; the calls that go
 * up are the hooks named where they are set):
 *   conn_state.c  this header: shared state and its primitives
 *   inchan.c      inchan_internal.h: in-channels, their credit, floating
 *                 buffers (and the in-channel half of connection.h)
 *   consumer.c    consumer_internal.h: the consumer's side: buffers,
 *                 errors and lent buffers arriving for in-channels; the
 *                 control frames an in-channel sends; releases
 *   producer.c    producer_internal.h: the producer's side: partition
 *                 requests, credit received, what a served channel sends
 *                 next, lending and releases
 *   lifecycle.c   lifecycle_internal.h: how a connection ends (failure,
 *                 protocol errors, the peer's end) and its heartbeat
 *   writer.c      writer_internal.h: frames out (the writer thread and
 *                 sends by producers' threads)
 *   reader.c      reader_internal.h: frames in (the frame reader driven
 *                 from the transport, each frame to its side; the reader
 *                 thread)
 *   direct.c      reads by threads that wait for something else
 *   connection.c  connection.h: creating, starting, closing, stats
 * Private to csrc/network: nothing outside includes these headers.  No
 * Python API. */
#ifndef FLINKBUF_CONN_INTERNAL_H
#define FLINKBUF_CONN_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "common/clock.h"
#include "network/connection.h"
#include "network/credit.h"
#include "network/frame_reader.h"
#include "network/lease.h"
#include "network/transport.h"
#include "network/wire.h"

#define CTL_CAP 65536               /* the writer's control-frame buffer */
/* The most a queued message writes: a partition request, and its channel's
 * buffer size after it. */
#define CTL_FRAME_ROOM (FB_NET_MAX_CONTROL_FRAME + FB_NET_BUFFER_SIZE_FRAME)
#define RELEASE_BATCH 256           /* segments per RELEASE: one fits FB_NET_MAX_CONTROL_FRAME */
#define IDMAP_SIZE (2 * FB_NET_MAX_CHANNELS)
#define NO_ID 0xFFFFFFFFu
#define RETRY_FIRST_NS 50000000LL   /* not-found requests: 50 ms, doubling ... */
#define RETRY_MAX_NS 1000000000LL   /* ... up to 1 s */
#define RX_YIELD 2                  /* read_step: left to the reader thread */
/* Partition requests a peer may send: REQUEST_BURST at once (a gate of as
 * many channels as a connection carries), then REQUEST_RATE a second. */
#define REQUEST_RATE 10000
#define REQUEST_BURST FB_NET_MAX_CHANNELS
/* NEW_BUFFER_SIZE frames a peer may send per served channel: SIZE_BURST at
 * once, then one per SIZE_INTERVAL_NS (2,000 a second).  An in-channel
 * writes at most one per SIZE_GAP_NS (announcements in between wait and
 * go as one, with the latest size): half the rate the producer allows, so
 * that frames the network bunched never spend an honest peer's budget. */
#define SIZE_BURST 64
#define SIZE_INTERVAL_NS 500000LL
#define SIZE_GAP_NS 1000000LL
/* Control messages queued for the writer; past this the reader reads no more
 * requests until the writer sent some (a peer that floods us with requests
 * and does not read the answers is held back by TCP, not by our memory).
 * It leaves room for what this side's in-channels queue themselves: one
 * ADD_CREDIT, ADD_EVENT_CREDIT and NEW_BUFFER_SIZE each at a time. */
#define CTL_MAX (3 * FB_NET_MAX_CHANNELS + 64)
/* Why a side refuses what the peer sent (a protocol error, said by the
 * unit above that ends the connection). */
#define WHY_LEN FB_NET_MAX_MESSAGE
/* A silent peer is asked for a heartbeat after this part of the I/O timeout. */
#define HEARTBEAT_PART 4

/* In-channel states. */
enum { CH_NEW, CH_REQUESTED, CH_RETRY, CH_FINISHED, CH_FAILED, CH_CLOSED };
/* Connection states. */
enum { CONN_OPEN, CONN_ENDED };
/* Who reads the socket: nobody, the reader thread, or a consumer's thread
 * waiting on its gate (a direct read). */
enum { RD_NONE, RD_THREAD, RD_DIRECT, RD_CLEANUP };
/* After a direct read the reader thread leaves the socket alone this long:
 * the consumer is likely back for its next buffer by then. */
#define RD_LEND_NS 500000

/* ---- receiver id -> slot (linear probing, backward-shift deletion) ------ */

typedef struct idmap {
    uint32_t key[IDMAP_SIZE];   /* NO_ID: empty */
    int32_t slot[IDMAP_SIZE];
} idmap_t;

/* ---- structures ------------------------------------------------------------ */

typedef struct batch batch_t;       /* what the writer sends in one sendmsg (writer.c) */

typedef struct outchan {
    uint32_t receiver_id;
    int32_t slot;
    fb_subpart_t *sp;
    void *owner;
    fb_localpool_t *pool;       /* the partition's pool (NULL: unknown) */
    int pool_waiter;            /* this connection is the pool's waiter (pool_wait) */
    int32_t credit;
    int32_t event_credit;       /* events the reader may still take */
    uint32_t seq;
    int cancelled;
    int lends;                  /* its buffers are lent, not copied (producer.c) */
    fb_owner_ref_t *ref;        /* keeps owner (and pool) alive while a buffer is lent */
    int64_t size_tat;           /* the budget of NEW_BUFFER_SIZE frames (producer.c) */
} outchan_t;

typedef struct ctl {
    struct ctl *next;
    uint8_t type;
    uint32_t receiver_id;       /* PARTITION_REQUEST, ADD_*CREDIT, NEW_BUFFER_SIZE: the
                                   channel's, read when sent */
    uint32_t len;               /* a prebuilt body (ERROR_RESPONSE) */
    char body[];
} ctl_t;

struct fb_floating {
    pthread_mutex_t mu;
    fb_localpool_t *pool;
    fb_waitlist_t wl;           /* channels that want segments, oldest first */
    int refs;
};

struct fb_inchan {
    fb_conn_t *conn;
    int refs;
    uint32_t receiver_id;
    int32_t slot;
    char partition_id[FB_NET_MAX_PARTITION_ID];
    uint16_t id_len;
    uint32_t subpartition;
    fb_signal_t on_poll;
    fb_subpart_t queue;
    fb_localpool_t *exclusive;
    fb_floating_t *floating;
    /* under conn->mu (cr.wants: under floating->mu) */
    fb_credit_t cr;
    uint32_t next_seq;
    int state;
    int gap;                    /* a lent buffer dropped as the connection ends:
                                   nothing after it is delivered (its failure follows) */
    int64_t request_deadline, retry_at, backoff_ns;
    int err_code;
    char err_type[FB_NET_MAX_ERROR_TYPE];
    char err_msg[FB_NET_MAX_MESSAGE];
    fb_item_t *failed_items;    /* what the queue held when the channel failed */
    int32_t nfailed_items;
    int64_t buffers_in, bytes_in;
    int32_t kept_busy;          /* kept segments on their way back (inchan.c) */
    /* Buffer debloating: the latest size announced (0: none) and the last
     * one written; its NEW_BUFFER_SIZE is queued, or waits until size_at
     * (one a SIZE_GAP_NS).  A PARTITION_REQUEST carries the size after it. */
    int32_t buffer_size, size_sent;
    uint8_t size_queued, size_waiting;
    int64_t size_at;
    /* Under a debloating bound: the consumer reads a buffer of this channel
     * (taken, not read to its end); credit held meanwhile is told to the
     * sender when the consumer runs dry (under conn->mu). */
    uint8_t reading;
};

struct fb_conn {
    fb_transport_t *t;          /* the byte stream */
    int32_t segment_size;
    int io_timeout_ms;
    fb_conn_callbacks_t cb;
    /* The lenders this connection offers (common/waiter.h), set by
     * connection.c: a gate's reader (a consumer waiting on it reads the
     * connection) and a served pool's waiter (a producer waiting for a
     * buffer does).  Both run direct.c's read_until. */
    int (*gate_lender)(void *arg, void *gate, int64_t deadline_ns);
    int (*pool_lender)(void *arg, void *pool, int64_t deadline_ns);
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* recv_busy cleared, close request sent */
    fb_gate_t out;               /* the writer's ready ring: 0 control, 1.. served slots */
    int state;
    int err_code;
    char err_msg[FB_NET_MAX_MESSAGE];
    outchan_t *outs[FB_NET_MAX_CHANNELS + 1];
    int32_t free_outs[FB_NET_MAX_CHANNELS], nfree_outs;
    idmap_t out_ids;
    fb_inchan_t *ins[FB_NET_MAX_CHANNELS];
    int32_t free_ins[FB_NET_MAX_CHANNELS], nfree_ins;
    idmap_t in_ids;
    uint32_t next_receiver_id;
    int32_t num_retrying;
    int32_t num_sizes_waiting;   /* in-channels whose NEW_BUFFER_SIZE waits for its time */
    ctl_t *ctl_head, *ctl_tail;
    int32_t nctl;                /* messages queued */
    int close_queued, close_sent;
    int close_on_send;           /* the socket closes once the CLOSE_REQUEST went */
    int closed;                  /* fb_conn_close ran */
    fb_inchan_t *recv_busy;      /* the reader receives into this channel's segment */
    int recv_abort;              /* atomic: that channel closes, let go of the segment */
    pthread_t reader, writer;
    int started;
    /* Who writes to the socket: the writer thread, or (caller_sends) a
     * producer's thread whose add found the writer idle.  send_mu is held
     * while a batch is gathered and sent; order: send_mu -> mu.  A batch a
     * producer's thread could not send whole without blocking waits in
     * `pending` (with its control messages in pending_taken) for the
     * writer thread, which sends it before anything else. */
    pthread_mutex_t send_mu;
    int caller_sends;
    fb_gate_hook_t hook;         /* ready: writer.c's conn_ready */
    batch_t *direct, *pending;
    struct ctl *pending_taken;
    int refs;
    fb_conn_stats_t stats;
    /* Frames in (reader.c): the frame being read belongs to the connection,
     * not to the thread that started it (whoever holds the read right goes
     * on), and so does the body being received for an in-channel. */
    fb_frame_reader_t fr;
    fb_inchan_t *rx_ch;          /* the channel a body is received for (a reference) ... */
    fb_item_t rx_item;           /* ... and where it goes */
    int32_t rx_backlog;
    int64_t rx_since;            /* when the last byte came */
    int64_t rq_tat;              /* the budget of partition requests (producer.c) */
    int64_t rq_resume;           /* the reader thread waits for the budget until then */
    /* Heartbeat (lifecycle.c).  The read right's holder asks a silent peer
     * for a heartbeat once per silence (ping_for: the rx_since it asked
     * for) and checks the answers; under mu: what the writer writes next. */
    int64_t ping_for;
    uint32_t ping_token;         /* mu: the last HEARTBEAT_REQUEST queued ... */
    int ping_queued;             /* mu: ... still to be written */
    uint32_t ping_written;       /* atomic: the last one written */
    uint32_t pong_seen;          /* the last one answered */
    uint32_t pong_token;         /* mu: a HEARTBEAT_RESPONSE to write (0: none) */
    /* The right to read the socket (rd_mu): the reader thread takes it when
     * the socket is readable and nobody has it; a consumer's thread waiting
     * on its gate takes it when it is free, receives what comes itself
     * (no hand-off from the reader thread, no wake-up of it) and, when it
     * leaves with its data, lends the socket for RD_LEND_NS before the
     * reader thread reads it again.  Order: never another lock under rd_mu. */
    pthread_mutex_t rd_mu;
    pthread_cond_t rd_cv;        /* the reader thread parks here */
    pthread_cond_t rd_done_cv;   /* a closer waits here for a direct reader to leave */
    int rd_owner;
    int rd_stop;                 /* the connection ended: nobody reads anymore */
    int direct_reads;            /* consumers may read the socket themselves */
    int64_t rd_lent_until;
    int direct_wake_fd;          /* an eventfd that wakes a direct reader's poll */
    int thread_wake_fd;          /* an eventfd that wakes the reader thread's poll */
    int write_errno;             /* atomic: writing failed as the peer went (conn_write_failed) */
    int peer_ended;              /* atomic: the peer ended its side first (its end was read) */
    int rd_thread_polls;         /* the reader thread polls with no time limit */
    /* the writer's control frames */
    char *ctlbuf;
    /* Lending.  Producer (producer.c): buffers of lend_np go to the peer as
     * BUFFER_LENT, recorded in `lent` (under mu) until released, or until
     * the connection's end gives them back.  Consumer (consumer.c): the
     * peer's arena (lease), and the recycled segments the next RELEASE
     * names. */
    const fb_netpool_t *lend_np;
    fb_lent_t lent;
    int peer_pidfd;
    fb_lease_t *lease;
    pthread_mutex_t rel_mu;      /* a leaf lock */
    uint32_t *rel;
    int32_t nrel;
};

static inline void stat_add(int64_t *counter, int64_t n)
{
    __atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

static inline char *segment_of(fb_localpool_t *pool, int32_t index)
{
    return fb_segment_address(pool->net, index);
}

static inline void copy_text(char *dst, size_t cap, const char *src, size_t n)
{
    if (cap == 0)
        return;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static inline int holds_buffers(const fb_inchan_t *ch)
{
    return ch->state == CH_NEW || ch->state == CH_REQUESTED || ch->state == CH_RETRY;
}

/* A frame is half read (its rest is coming), in the frame reader or in the
 * transport under it (a sealed record not whole yet).  The read right's
 * holder asks. */
static inline int mid_frame(fb_conn_t *c)
{
    return fb_frame_mid(&c->fr) || fb_transport_partial(c->t);
}

/* A consumer's thread reads the socket, or did a moment ago (the lend): what
 * it leaves for the writer (credit, releases) goes out with its next read. */
static inline int consumer_reads(fb_conn_t *c)
{
    return __atomic_load_n(&c->rd_owner, __ATOMIC_RELAXED) == RD_DIRECT
           || fb_monotonic_ns() < __atomic_load_n(&c->rd_lent_until, __ATOMIC_RELAXED);
}

/* Control frames wait to be written: messages, or releases (unlocked look). */
static inline int control_waits(fb_conn_t *c)
{
    return __atomic_load_n(&c->nctl, __ATOMIC_RELAXED) > 0
           || __atomic_load_n(&c->nrel, __ATOMIC_RELAXED) > 0;
}

/* Writing failed as the peer went (conn_write_failed). */
static inline int write_failed(fb_conn_t *c)
{
    return __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE) != 0;
}

#pragma GCC visibility push(hidden)

/* ---- conn_state.c, for every unit above it -------------------------------- */

void idmap_init(idmap_t *m);
int32_t idmap_get(const idmap_t *m, uint32_t id);
void idmap_put(idmap_t *m, uint32_t id, int32_t slot);
void idmap_del(idmap_t *m, uint32_t id);
/* The slot of in-channel `id` (mu held), or -1. */
int32_t in_lookup(fb_conn_t *c, uint32_t id);
void notify_writer(fb_conn_t *c, int32_t slot);
/* Make `slot` ready and send it now in this thread, through the out gate's
 * hook (writer.c's conn_ready; caller_sends only), without waiting. */
void send_now(fb_conn_t *c, int32_t slot);
/* Control messages were queued (no lock held): with caller_sends (and `how`
 * 1) this thread sends them now if the writer thread is idle (send_now),
 * else (`how` 2) the writer thread is woken. */
void writer_kick(fb_conn_t *c, int how);
void ctl_free_list(ctl_t *m);
/* Queue a control message (mu held); the writer sends them in order.  A
 * quiet push leaves waking the writer to the caller, once it has unlocked. */
int ctl_push_quiet(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                   uint32_t len, int quiet);
int ctl_push(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
             uint32_t len);
/* An ERROR_RESPONSE (mu held). */
int ctl_error(fb_conn_t *c, uint32_t receiver_id, int code, const char *type,
              const char *msg);
/* The socket goes: both directions shut, the writer stops.  Idempotent. */
void close_socket(fb_conn_t *c);
void inchan_incref(fb_inchan_t *ch);
/* References for lenders and the gate hook (fb_lender_t, fb_gate_hook_t). */
void conn_hold(void *arg);
void conn_release(void *arg);

#pragma GCC visibility pop

#endif
