/* Multi-threaded stress of the connection layer (csrc/network), built with
 * ThreadSanitizer or AddressSanitizer+UBSan by tests/test_csrc.py.
 *
 * Two connections in one process, over a socketpair (or TCP loopback, or
 * shared memory over a socketpair): the
 * producer side serves NCHAN subpartitions, filled by producer threads from
 * one small pool (so they block on buffers: backpressure), with data
 * buffers, user events and a final EndOfPartition; the consumer side reads
 * them through remote input channels (exclusive and floating buffers) in
 * NGATES gates, one consumer thread per gate, which checks every buffer and
 * recycles it, and announces a buffer size (buffer debloating) after every
 * buffer it took, far more often than the one a millisecond the channel
 * sends (and than the producer side's budget allows).  Over "lend" (shared memory, the producers' pool a shared
 * arena) the producer side lends its data buffers instead of copying them:
 * the consumers read them in place, their recycles go back as RELEASE, and
 * after a connection ends what was lent comes back (the consumer side lets
 * go of the arena before it ends).  Rounds vary direct reads and caller
 * sends, cancel channels from the consumer side mid-stream, close either
 * connection while everybody is busy, and leave both sides quiet with a
 * short I/O timeout (heartbeats keep them open).  After every round all
 * segments must be back.
 *
 * Usage: stress_connection [buffers per channel] [unix|tcp|shm|lend]
 * Prints "ok" and exits 0, or prints why not and exits 1. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "buffer/pool.h"
#include "io/exchange.h"
#include "network/connection.h"
#include "network/lease.h"
#include "network/seal.h"
#include "network/shm.h"

#define SEG 1024                /* segment size on both sides */
#define HDR 16                  /* a data buffer's header: channel, seq, size, checksum */
#define NCHAN 4
#define NGATES 2                /* NCHAN / NGATES channels per gate */
#define EXCLUSIVE 2             /* per channel */
#define FLOATING 3              /* per gate */
#define PRODUCER_SEGMENTS 6     /* one pool for all producers */
#define CONSUMER_SEGMENTS (NCHAN * EXCLUSIVE + NGATES * FLOATING)
#define WAIT_S 20.0             /* no single wait of a healthy run comes near this */
#define ROUND_LIMIT_S 45.0      /* the watchdog's limit per phase */
#define EVENT_TAG 0xE5
#define EVENT_BURST 20          /* more than FB_NET_EVENT_WINDOW */
#define QUIET_IO_TIMEOUT_S 2.0  /* a quiet round's: a heartbeat after 0.5 s of silence */

enum { PRODUCER_SIDE = 0, CONSUMER_SIDE = 1, NO_SIDE = -1 };
/* What became of a consumer's channel. */
enum { RCH_OPEN, RCH_FINISHED, RCH_CANCELLED, RCH_FAILED };

/* ---- failing, and the watchdog ---------------------------------------------------- */

static const char *g_phase = "start";
static int64_t g_phase_deadline = FB_WAIT_FOREVER;
static int g_watchdog_stop;

static int g_dying;

static void die(const char *fmt, ...)
{
    va_list ap;
    if (__atomic_exchange_n(&g_dying, 1, __ATOMIC_ACQ_REL))
        for (;;)
            pause();                        /* the first failure speaks and exits */
    printf("FAIL (%s): ", __atomic_load_n(&g_phase, __ATOMIC_ACQUIRE));
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    _exit(1);
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            die("%s:%d: check failed: %s", __FILE__, __LINE__, #cond);                             \
    } while (0)

static void set_phase(const char *phase)
{
    __atomic_store_n(&g_phase, phase, __ATOMIC_RELEASE);
    __atomic_store_n(&g_phase_deadline, fb_deadline_after(ROUND_LIMIT_S), __ATOMIC_RELEASE);
}

/* A hang fails the run with the phase it hung in, rather than a timeout. */
static void *watchdog_main(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&g_watchdog_stop, __ATOMIC_ACQUIRE)) {
        if (fb_monotonic_ns() > __atomic_load_n(&g_phase_deadline, __ATOMIC_ACQUIRE))
            die("hung for %.0f s", ROUND_LIMIT_S);
        usleep(100000);
    }
    return NULL;
}

/* ---- the buffers' contents --------------------------------------------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static int32_t payload_size(uint32_t k, uint32_t seq)
{
    return HDR + (int32_t)(mix(k * 0x9e3779b9u ^ seq) % (SEG - HDR + 1));
}

/* Data buffer `seq` of channel k: a header (k, seq, size, checksum of the
 * body) and a body of bytes that only (k, seq) give. */
static void fill_payload(char *p, uint32_t k, uint32_t seq, int32_t size)
{
    uint32_t x = mix(k * 0x85ebca6bu + seq), sum = 2166136261u, h[4];
    for (int32_t i = HDR; i < size; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (char)(x >> 16);
        sum = (sum ^ (uint8_t)p[i]) * 16777619u;
    }
    h[0] = k, h[1] = seq, h[2] = (uint32_t)size, h[3] = sum;
    memcpy(p, h, HDR);
}

static int payload_ok(const char *p, uint32_t k, uint32_t seq, int32_t size)
{
    char want[SEG];
    if (size != payload_size(k, seq))
        return 0;
    fill_payload(want, k, seq, size);
    return memcmp(p, want, (size_t)size) == 0;
}

/* User events after data buffer `seq`: now and then one, sometimes a burst
 * larger than the event window. */
static int events_after(uint32_t seq)
{
    return seq % 61 != 60 ? 0 : seq % 183 == 182 ? EVENT_BURST : 1;
}

static int64_t events_before(uint32_t nbuf)
{
    int64_t n = 0;
    for (uint32_t s = 0; s < nbuf; s++)
        n += events_after(s);
    return n;
}

/* ---- rounds, sessions --------------------------------------------------------------- */

typedef struct round {
    const char *name;
    int direct_reads, caller_sends;     /* of both connections */
    int small_socket_buffers;           /* partial sends: batches left to the writer */
    int sessions;                       /* partitions read one after the other */
    int cancel;                         /* consumers close some channels mid-stream */
    int close_side;                     /* the connection closed mid-stream, or NO_SIDE */
    double quiet_s;                     /* then both sides idle this long (io_timeout 2 s:
                                           heartbeats cross, and keep them open) */
} round_t;

typedef struct server server_t;
typedef struct session session_t;

typedef struct world {
    fb_netpool_t prod_np, cons_np;
    fb_conn_t *conn[2];                 /* PRODUCER_SIDE, CONSUMER_SIDE */
    server_t *server;
    int lend;                           /* the producer side lends its buffers */
} world_t;

typedef struct producer {
    session_t *s;
    uint32_t k;
    int refused;                        /* the add a release refused, or 0 */
} producer_t;

typedef struct rchan {
    fb_inchan_t *ch;
    fb_localpool_t excl;
    uint32_t next_seq;                  /* exactly once, in order */
    int64_t events;
    int state;                          /* RCH_* */
    int err_code;
} rchan_t;

typedef struct gate {
    session_t *s;
    fb_gate_t g;
    fb_localpool_t fpool;
    fb_floating_t *floating;
    int first, n;                       /* its channels: rch[first .. first + n) */
} gate_t;

struct session {
    world_t *w;
    const round_t *rd;
    uint32_t nbuf;
    char pid[32];
    /* producer side */
    fb_localpool_t pool;
    fb_subpart_t sp[NCHAN];
    int served[NCHAN];                  /* requests found (under the server's lock) */
    producer_t prod[NCHAN];
    pthread_t prod_th[NCHAN];
    /* consumer side */
    rchan_t rch[NCHAN];
    gate_t gates[NGATES];
    pthread_t cons_th[NGATES];
    int64_t consumed;                   /* atomic: data buffers checked so far */
};

/* The channels a consumer closes itself in a cancel round, and when. */
static int cancel_point(const session_t *s, uint32_t k)
{
    return s->rd->cancel && k % 3 == 0 ? (int)(s->nbuf / 4 + 7 * k) : -1;
}

static int failures_expected(const session_t *s)
{
    return s->rd->close_side != NO_SIDE;
}

/* ---- the producer side's callbacks: the partition table ------------------------------ */

struct server {
    pthread_mutex_t mu;
    session_t *current;                 /* the partition served now, or NULL */
    int live_owners;
};

static int find_subpartition(void *ctx, const char *partition_id, size_t len,
                             uint32_t subpartition, fb_subpart_t **sp, void **owner,
                             fb_localpool_t **pool, char *errbuf, size_t errlen)
{
    server_t *srv = ctx;
    session_t *s;
    int rc = FB_NET_ERR_NOT_FOUND;
    pthread_mutex_lock(&srv->mu);
    s = srv->current;
    if (s != NULL && len == strlen(s->pid) && memcmp(partition_id, s->pid, len) == 0
            && subpartition < NCHAN) {
        CHECK(++s->served[subpartition] == 1);
        srv->live_owners++;
        *sp = &s->sp[subpartition];
        *pool = &s->pool;
        *owner = s;
        rc = 0;
    }
    pthread_mutex_unlock(&srv->mu);
    if (rc != 0)
        snprintf(errbuf, errlen, "no such partition");
    return rc;
}

static void describe_failure(void *ctx, void *owner, char *type, size_t tlen, char *message,
                             size_t mlen)
{
    (void)ctx, (void)owner;
    snprintf(type, tlen, "StressError");
    snprintf(message, mlen, "no producer fails in this test");
}

static void release_owner(void *ctx, void *owner)
{
    server_t *srv = ctx;
    (void)owner;
    pthread_mutex_lock(&srv->mu);
    CHECK(--srv->live_owners >= 0);
    pthread_mutex_unlock(&srv->mu);
}

static int serves_nothing(void *ctx, const char *partition_id, size_t len, uint32_t subpartition,
                          fb_subpart_t **sp, void **owner, fb_localpool_t **pool, char *errbuf,
                          size_t errlen)
{
    (void)ctx, (void)partition_id, (void)len, (void)subpartition, (void)sp, (void)owner;
    (void)pool;
    snprintf(errbuf, errlen, "the consumer side serves nothing");
    return FB_NET_ERR_NOT_FOUND;
}

static int live_owners(server_t *srv)
{
    int n;
    pthread_mutex_lock(&srv->mu);
    n = srv->live_owners;
    pthread_mutex_unlock(&srv->mu);
    return n;
}

/* ---- producers ------------------------------------------------------------------------ */

/* Add an item; on refusal it is given back and the producer stops. */
static int produce(producer_t *p, fb_item_t item, int last)
{
    int rc = fb_subpart_add(&p->s->sp[p->k], item, last);
    if (rc == FB_OK)
        return 1;
    fb_item_dispose(&item);
    /* Only a cancel or a closed connection releases a subpartition. */
    if (rc != FB_ERELEASED || !(p->s->rd->cancel || failures_expected(p->s)))
        die("producer %u: add refused with %d", p->k, rc);
    p->refused = rc;
    return 0;
}

static int produce_buffer(producer_t *p, uint32_t seq)
{
    session_t *s = p->s;
    int32_t index, size = payload_size(p->k, seq);
    int rc = fb_localpool_request_blocking(&s->pool, (int32_t)p->k, fb_deadline_after(WAIT_S),
                                           &index);
    fb_item_t item = {NULL, &s->pool, 0, FB_ITEM_DATA, size};
    if (rc != FB_OK)
        die("producer %u: no buffer for seq %u: %d", p->k, seq, rc);
    item.index = index;
    item.data = fb_segment_address(&s->w->prod_np, index);
    fill_payload(item.data, p->k, seq, size);
    return produce(p, item, 0);
}

/* An event of `size` malloc'd bytes: a user event (tag, its index in the
 * burst, the data buffers before it) or EndOfPartition (one zero byte). */
static int produce_event(producer_t *p, int burst_index, uint32_t data_before, int eop)
{
    fb_item_t item = {malloc(8), NULL, -1, FB_ITEM_EVENT, eop ? 1 : 8};
    CHECK(item.data != NULL);
    if (eop) {
        item.data[0] = 0;
    } else {
        item.data[0] = (char)EVENT_TAG;
        item.data[1] = (char)burst_index;
        item.data[2] = item.data[3] = 0;
        memcpy(item.data + 4, &data_before, 4);
    }
    return produce(p, item, eop);
}

static void *producer_main(void *arg)
{
    producer_t *p = arg;
    for (uint32_t seq = 0; seq < p->s->nbuf; seq++) {
        if (!produce_buffer(p, seq))
            return NULL;
        for (int e = 0; e < events_after(seq); e++)
            if (!produce_event(p, e, seq + 1, 0))
                return NULL;
    }
    produce_event(p, 0, p->s->nbuf, 1);
    return NULL;
}

/* ---- consumers ------------------------------------------------------------------------ */

/* The consumer is done with a channel: as an input gate releases one. */
static void release_channel(gate_t *gt, rchan_t *c, int state)
{
    fb_inchan_detach_reader(c->ch, &gt->g);
    fb_subpart_disconnect(fb_inchan_queue(c->ch), &gt->g);
    fb_inchan_close(c->ch);
    c->state = state;
}

/* A data buffer of channel k: the next in order and intact.  The consumer
 * keeps it until it takes the next one (as a deserializer holds its
 * current buffer); 1 if that was this channel's cancel point. */
static int take_data(gate_t *gt, uint32_t k, fb_item_t *item, fb_item_t *held)
{
    rchan_t *c = &gt->s->rch[k];
    if (!payload_ok(item->data, k, c->next_seq, item->size))
        die("channel %u: buffer %u is not the expected one (%d bytes)", k, c->next_seq,
            item->size);
    c->next_seq++;
    __atomic_add_fetch(&gt->s->consumed, 1, __ATOMIC_RELAXED);
    fb_inchan_announce_buffer_size(c->ch, FB_NET_MIN_BUFFER_SIZE
                                   + (int32_t)(mix(k * 7919 + c->next_seq)
                                               % (SEG - FB_NET_MIN_BUFFER_SIZE + 1)));
    if (held->data != NULL)
        fb_item_dispose(held);
    *held = *item;
    if ((int)c->next_seq != cancel_point(gt->s, k))
        return 0;
    release_channel(gt, c, RCH_CANCELLED);
    return 1;
}

/* An event of channel k: 1 if it was EndOfPartition. */
static int take_event(gate_t *gt, uint32_t k, fb_item_t *item)
{
    rchan_t *c = &gt->s->rch[k];
    uint32_t before;
    int eop = item->size == 1 && item->data[0] == 0;
    if (eop) {
        CHECK(c->next_seq == gt->s->nbuf);
        CHECK(c->events == events_before(gt->s->nbuf));
    } else {
        CHECK(item->size == 8 && (uint8_t)item->data[0] == EVENT_TAG);
        memcpy(&before, item->data + 4, 4);
        CHECK(before == c->next_seq);       /* in its place among the data */
        CHECK(item->data[1] == (char)(c->events - events_before(before - 1)));
        c->events++;
        fb_inchan_event_taken(c->ch);
    }
    fb_item_dispose(item);
    if (eop)
        release_channel(gt, c, RCH_FINISHED);
    return eop;
}

/* Take what channel k has (one item): 1 if the channel ended for us. */
static int consume(gate_t *gt, uint32_t k, fb_item_t *held)
{
    rchan_t *c = &gt->s->rch[k];
    fb_item_t item;
    char type[FB_NET_MAX_ERROR_TYPE], msg[FB_NET_MAX_MESSAGE];
    int rc;
    if (c->state != RCH_OPEN)
        return 0;                           /* still on the ring when we released it */
    rc = fb_subpart_poll(fb_inchan_queue(c->ch), &item);
    if (rc == FB_EMPTY)
        return 0;
    if (rc == FB_EFAILED) {
        c->err_code = fb_inchan_error(c->ch, type, sizeof(type), msg, sizeof(msg));
        if (!failures_expected(gt->s))
            die("channel %u failed (%d): %s", k, c->err_code, msg);
        release_channel(gt, c, RCH_FAILED);
        return 1;
    }
    if (rc != FB_OK)
        die("channel %u: poll returned %d", k, rc);
    if (item.kind == FB_ITEM_DATA)
        return take_data(gt, k, &item, held);
    return take_event(gt, k, &item);
}

static void *consumer_main(void *arg)
{
    gate_t *gt = arg;
    fb_item_t held = {NULL, NULL, -1, 0, 0};
    int32_t idx;
    int open = gt->n, rc;
    while (open > 0) {
        /* In slices, as the input gate waits (the watchdog catches hangs). */
        rc = fb_gate_wait(&gt->g, fb_deadline_after(0.05), &idx);
        if (rc == FB_ETIMEDOUT)
            continue;
        if (rc != FB_OK)
            die("gate %d: wait returned %d", (int)(gt - gt->s->gates), rc);
        open -= consume(gt, (uint32_t)(gt->first + idx), &held);
    }
    if (held.data != NULL)
        fb_item_dispose(&held);
    return NULL;
}

/* ---- session set-up and checks ------------------------------------------------------- */

static void open_channel(session_t *s, gate_t *gt, uint32_t k)
{
    rchan_t *c = &s->rch[k];
    int32_t index;
    CHECK(fb_localpool_create(&s->w->cons_np, &c->excl, EXCLUSIVE, EXCLUSIVE, 0, FB_UNBOUNDED, 0)
          == FB_OK);
    c->ch = fb_inchan_new(s->w->conn[CONSUMER_SIDE], s->pid, strlen(s->pid), k, &c->excl,
                          gt->floating, fb_deadline_after(WAIT_S));
    CHECK(c->ch != NULL);
    for (int e = 0; e < EXCLUSIVE; e++) {
        CHECK(fb_localpool_request_blocking(&c->excl, FB_NO_CHANNEL, fb_deadline_after(WAIT_S),
                                            &index) == FB_OK);
        CHECK(fb_inchan_add_exclusive(c->ch, index) == FB_OK);
    }
    CHECK(fb_inchan_open(c->ch) == FB_OK);
    CHECK(fb_subpart_connect(fb_inchan_queue(c->ch), &gt->g, (int32_t)k - gt->first) == FB_OK);
    fb_inchan_attach_reader(c->ch, &gt->g);     /* the gate takes its first channel's */
}

/* The served partition (registered before anyone asks for it), then the
 * consumers' gates and channels. */
static void session_open(session_t *s)
{
    for (int k = 0; k < NCHAN; k++)
        CHECK(fb_subpart_init(&s->sp[k], NULL) == FB_OK);
    CHECK(fb_localpool_create(&s->w->prod_np, &s->pool, PRODUCER_SEGMENTS, PRODUCER_SEGMENTS,
                              NCHAN, FB_UNBOUNDED, 0) == FB_OK);
    pthread_mutex_lock(&s->w->server->mu);
    s->w->server->current = s;
    pthread_mutex_unlock(&s->w->server->mu);
    for (int i = 0; i < NGATES; i++) {
        gate_t *gt = &s->gates[i];
        gt->s = s;
        gt->n = NCHAN / NGATES;
        gt->first = i * gt->n;
        CHECK(fb_localpool_create(&s->w->cons_np, &gt->fpool, FLOATING, FLOATING, 0,
                                  FB_UNBOUNDED, 0) == FB_OK);
        CHECK((gt->floating = fb_floating_new(&gt->fpool)) != NULL);
        CHECK(fb_gate_init(&gt->g, gt->n) == FB_OK);
        for (int j = 0; j < gt->n; j++)
            open_channel(s, gt, (uint32_t)(gt->first + j));
    }
}

static void start_threads(session_t *s)
{
    for (uint32_t k = 0; k < NCHAN; k++) {
        s->prod[k].s = s;
        s->prod[k].k = k;
        CHECK(pthread_create(&s->prod_th[k], NULL, producer_main, &s->prod[k]) == 0);
    }
    for (int i = 0; i < NGATES; i++)
        CHECK(pthread_create(&s->cons_th[i], NULL, consumer_main, &s->gates[i]) == 0);
}

/* Wait (for the connections' threads) until cond(s) holds. */
static void await(session_t *s, int (*cond)(session_t *), const char *what)
{
    int64_t deadline = fb_deadline_after(WAIT_S);
    while (!cond(s)) {
        if (fb_monotonic_ns() > deadline)
            die("timed out waiting until %s (%d owners, channels: %d producer side, "
                "%d consumer side)", what, live_owners(s->w->server),
                fb_conn_num_channels(s->w->conn[PRODUCER_SIDE]),
                fb_conn_num_channels(s->w->conn[CONSUMER_SIDE]));
        usleep(1000);
    }
}

/* (Lending: an owner lives on while its segments are lent, until the
 * consumer side recycles them: no_owners_left, after its teardown.) */
static int no_channels_left(session_t *s)
{
    return (s->w->lend || live_owners(s->w->server) == 0)
           && fb_conn_num_channels(s->w->conn[PRODUCER_SIDE]) == 0
           && fb_conn_num_channels(s->w->conn[CONSUMER_SIDE]) == 0;
}

static int no_owners_left(session_t *s)
{
    return live_owners(s->w->server) == 0;
}

static int busy_enough(session_t *s)
{
    return __atomic_load_n(&s->consumed, __ATOMIC_RELAXED) >= (int64_t)NCHAN * s->nbuf / 3;
}

/* What each channel got, by the kind of round. */
static void check_channels(session_t *s)
{
    for (uint32_t k = 0; k < NCHAN; k++) {
        rchan_t *c = &s->rch[k];
        producer_t *p = &s->prod[k];
        CHECK(c->state != RCH_OPEN);
        int32_t size = fb_subpart_buffer_size(&s->sp[k]);
        CHECK(size == 0 || (size >= FB_NET_MIN_BUFFER_SIZE && size <= SEG));
        if (c->state == RCH_FINISHED) {
            CHECK(c->next_seq == s->nbuf && p->refused == 0);
            CHECK(size > 0);                    /* announced long before the end */
        } else if (c->state == RCH_CANCELLED) {
            CHECK((int)c->next_seq == cancel_point(s, k));
        } else {
            CHECK(failures_expected(s));
            CHECK(c->err_code == FB_NET_ERR_CLOSED || c->err_code == FB_NET_ERR_CONNECTION);
        }
        if (!s->rd->cancel && !failures_expected(s))
            CHECK(c->state == RCH_FINISHED);
    }
}

/* ---- session teardown ---------------------------------------------------------------- */

/* Nothing handed out: every segment the pool took is idle in it. */
static void check_pool_idle(fb_localpool_t *lp, const char *what)
{
    fb_localpool_stats_t st;
    fb_localpool_stats(lp, &st);
    if (st.num_requested != st.num_avail || st.num_overdraft != 0)
        die("%s: %d segments requested, %d idle", what, st.num_requested, st.num_avail);
    fb_localpool_destroy(lp);
    fb_localpool_free(lp);
}

static void close_consumer_side(session_t *s)
{
    for (int i = 0; i < NGATES; i++) {
        gate_t *gt = &s->gates[i];
        for (int j = 0; j < gt->n; j++) {
            rchan_t *c = &s->rch[gt->first + j];
            fb_inchan_close(c->ch);             /* (closed already: a no-op) */
            fb_inchan_decref(c->ch);
            check_pool_idle(&c->excl, "an exclusive pool");
        }
        fb_floating_detach(gt->floating);
        fb_floating_decref(gt->floating);
        check_pool_idle(&gt->fpool, "a floating pool");
        fb_gate_free(&gt->g);
    }
}

/* Release the served subpartitions (what is queued goes back), which also
 * ends producers still waiting for buffers. */
static void release_served(session_t *s)
{
    fb_item_t *items;
    int32_t n;
    pthread_mutex_lock(&s->w->server->mu);
    s->w->server->current = NULL;
    pthread_mutex_unlock(&s->w->server->mu);
    for (int k = 0; k < NCHAN; k++) {
        if (s->rd->close_side == NO_SIDE && !s->rd->cancel)
            CHECK(fb_subpart_drained(&s->sp[k]) && fb_subpart_size(&s->sp[k]) == 0);
        n = fb_subpart_terminate(&s->sp[k], FB_SP_RELEASED, &items);
        if (n > 0)
            fb_items_dispose(items, n);
    }
}

static void close_producer_side(session_t *s)
{
    for (int k = 0; k < NCHAN; k++)
        fb_subpart_free(&s->sp[k]);
    check_pool_idle(&s->pool, "the producers' pool");
}

/* ---- a session: one partition read over the connections ------------------------------ */

static void join_all(pthread_t *th, int n)
{
    for (int i = 0; i < n; i++)
        CHECK(pthread_join(th[i], NULL) == 0);
}

/* A connection closes while producers and consumers are busy: channels
 * fail or end, served subpartitions are released, and everything unwinds. */
static void close_mid_stream(session_t *s)
{
    world_t *w = s->w;
    int victim = s->rd->close_side;
    await(s, busy_enough, "a third of the buffers went through");
    fb_conn_close(w->conn[victim]);
    join_all(s->cons_th, NGATES);
    fb_conn_close(w->conn[1 - victim]);
    await(s, no_channels_left, "the closed connections dropped their channels");
    release_served(s);
    join_all(s->prod_th, NCHAN);
}

static void run_session(world_t *w, const round_t *rd, uint32_t nbuf, int index)
{
    session_t *s = calloc(1, sizeof(*s));
    CHECK(s != NULL);
    s->w = w;
    s->rd = rd;
    s->nbuf = nbuf;
    snprintf(s->pid, sizeof(s->pid), "partition-%d", index);
    session_open(s);
    start_threads(s);
    if (rd->close_side != NO_SIDE) {
        close_mid_stream(s);
    } else {
        join_all(s->cons_th, NGATES);
        join_all(s->prod_th, NCHAN);
        /* Cancelled channels end over there once the cancel arrives. */
        await(s, no_channels_left, "every channel ended on both connections");
        release_served(s);
    }
    check_channels(s);
    close_consumer_side(s);
    await(s, no_owners_left, "every lent segment came back");
    close_producer_side(s);
    free(s);
}

/* ---- connections and rounds --------------------------------------------------------- */

static void tcp_pair(int fds[2])
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int one = 1, l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(l >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fds[0] >= 0 && connect(fds[0], (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK((fds[1] = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0);
    close(l);
    for (int i = 0; i < 2; i++)
        CHECK(setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0);
}

static void socket_pair(int tcp, int small_buffers, int fds[2])
{
    int size = 4096;
    if (tcp)
        tcp_pair(fds);
    else
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    for (int i = 0; small_buffers && i < 2; i++) {
        CHECK(setsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)) == 0);
        CHECK(setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)) == 0);
    }
}

enum { OVER_UNIX, OVER_TCP, OVER_SHM, OVER_LEND, OVER_SEALED };

/* A TCP socket sealed both ways (keys as a handshake would pair them). */
static fb_transport_t *sealed_socket(int fd, int side)
{
    unsigned char a[FB_SEAL_KEY], b[FB_SEAL_KEY];
    memset(a, 0xa5, sizeof(a));
    memset(b, 0x5a, sizeof(b));
    return fb_transport_sealed(fb_transport_socket(fd), side ? b : a, side ? a : b);
}

static fb_conn_t *new_conn(fb_transport_t *t, const fb_conn_callbacks_t *cb, const round_t *rd)
{
    fb_conn_t *c;
    CHECK(t != NULL);
    c = fb_conn_new(t, SEG, cb, rd->quiet_s > 0 ? QUIET_IO_TIMEOUT_S : 10.0);
    CHECK(c != NULL);
    fb_conn_set_caller_sends(c, rd->caller_sends);
    fb_conn_set_direct_reads(c, rd->direct_reads);
    return c;
}

/* The producer side lends buffers of its shared pool to the consumer side,
 * "another process" that is this one (its pidfd never ends: the ledger
 * brings the loans back). */
static void lend_pair(world_t *w, fb_conn_t *pair[2])
{
    char err[256];
    int ledger = fb_ledger_new(w->prod_np.num_segments);
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    CHECK(ledger >= 0 && pidfd >= 0);
    CHECK(fb_conn_lend(pair[0], &w->prod_np, pidfd, ledger) == 0);
    if (fb_conn_borrow(pair[1], fb_netpool_memfd(&w->prod_np), ledger, err, sizeof(err)) != 0)
        die("cannot borrow: %s", err);
    close(ledger);
}

/* Both ends of a connection pair over `over` (small socket buffers: the
 * smallest rings), started. */
static void open_pair(world_t *w, int over, const round_t *rd,
                      const fb_conn_callbacks_t *serving, const fb_conn_callbacks_t *reading,
                      fb_conn_t *out[2])
{
    int fds[2], region[FB_SHM_NFDS];
    char err[256];
    socket_pair(over == OVER_TCP || over == OVER_SEALED, rd->small_socket_buffers, fds);
    if (over == OVER_SEALED) {
        out[0] = new_conn(sealed_socket(fds[0], 0), serving, rd);
        out[1] = new_conn(sealed_socket(fds[1], 1), reading, rd);
    } else if (over == OVER_UNIX || over == OVER_TCP) {
        out[0] = new_conn(fb_transport_socket(fds[0]), serving, rd);
        out[1] = new_conn(fb_transport_socket(fds[1]), reading, rd);
    } else {
        CHECK(fb_shm_region_new(fb_shm_ring_size(rd->small_socket_buffers ? 256 : SEG),
                                region) == 0);
        out[0] = new_conn(fb_transport_shm(fds[0], region[FB_SHM_MEMFD], region[FB_SHM_DATA0],
                                           region[FB_SHM_ROOM0], 0, err, sizeof(err)),
                          serving, rd);
        out[1] = new_conn(fb_transport_shm(fds[1], region[FB_SHM_MEMFD], region[FB_SHM_DATA1],
                                           region[FB_SHM_ROOM1], 1, err, sizeof(err)),
                          reading, rd);
        close(region[FB_SHM_MEMFD]);
        if (over == OVER_LEND)
            lend_pair(w, out);
    }
    CHECK(fb_conn_start(out[0]) == FB_OK && fb_conn_start(out[1]) == FB_OK);
}

/* Every segment of a side is back in its network pool, which goes. */
static void close_netpool(fb_netpool_t *np, int32_t total, const char *side)
{
    if (fb_netpool_num_free(np) != total)
        die("%s side: %d of %d segments are back", side, fb_netpool_num_free(np), total);
    CHECK(fb_netpool_total_required(np) == 0);
    CHECK(fb_netpool_destroy(np) == 0);
    CHECK(fb_netpool_arena_released(np));
    fb_netpool_free(np);
}

static void check_traffic(world_t *w, const round_t *rd, uint32_t nbuf)
{
    fb_conn_stats_t in, out;
    int64_t want = (int64_t)rd->sessions * NCHAN * nbuf;
    fb_conn_stats(w->conn[CONSUMER_SIDE], &in);
    fb_conn_stats(w->conn[PRODUCER_SIDE], &out);
    if (rd->cancel || rd->close_side != NO_SIDE)
        return;
    if (in.buffers_in != want || out.buffers_out != want)
        die("%lld buffers sent, %lld received, %lld produced", (long long)out.buffers_out,
            (long long)in.buffers_in, (long long)want);
    CHECK(in.bytes_in <= out.bytes_out && out.bytes_in <= in.bytes_out);
    if (w->lend && in.bytes_in >= want * 64)     /* data came as segment numbers */
        die("lent, yet %lld bytes came for %lld buffers", (long long)in.bytes_in,
            (long long)want);
}

static void run_round(const round_t *rd, uint32_t nbuf, int over)
{
    world_t w;
    server_t srv = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};
    fb_conn_callbacks_t serving = {&srv, find_subpartition, describe_failure, release_owner};
    fb_conn_callbacks_t reading = {NULL, serves_nothing, describe_failure, release_owner};
    fb_conn_t *pair[2];
    set_phase(rd->name);
    memset(&w, 0, sizeof(w));
    w.server = &srv;
    w.lend = over == OVER_LEND;
    CHECK(fb_netpool_init(&w.prod_np, PRODUCER_SEGMENTS, SEG, 64, w.lend) == FB_OK);
    CHECK(fb_netpool_init(&w.cons_np, CONSUMER_SEGMENTS, SEG, 64, 0) == FB_OK);
    open_pair(&w, over, rd, &serving, &reading, pair);
    w.conn[PRODUCER_SIDE] = pair[0];
    w.conn[CONSUMER_SIDE] = pair[1];
    for (int i = 0; i < rd->sessions; i++)
        run_session(&w, rd, nbuf, i);
    if (rd->quiet_s > 0) {              /* silent peers answer: nothing fails */
        struct timespec ts = {(time_t)rd->quiet_s,
                              (long)((rd->quiet_s - (time_t)rd->quiet_s) * 1e9)};
        nanosleep(&ts, NULL);
        for (int i = 0; i < 2; i++)
            if (!fb_conn_is_open(w.conn[i])) {
                char why[256];
                fb_conn_error(w.conn[i], why, sizeof(why));
                die("a quiet connection ended: %s", why);
            }
    }
    for (int i = 0; i < 2; i++)
        fb_conn_close(w.conn[i]);
    check_traffic(&w, rd, nbuf);        /* (counted after the sends: once they ended) */
    for (int i = 0; i < 2; i++)
        fb_conn_decref(w.conn[i]);
    CHECK(live_owners(&srv) == 0);
    close_netpool(&w.prod_np, PRODUCER_SEGMENTS, "producer");
    close_netpool(&w.cons_np, CONSUMER_SEGMENTS, "consumer");
}

static const round_t ROUNDS[] = {
    /* name                           direct caller small sessions cancel close */
    {"direct reads + caller sends",        1, 1, 0, 2, 0, NO_SIDE},
    {"connection threads only",            0, 0, 1, 2, 0, NO_SIDE},
    {"caller sends only",                  0, 1, 1, 2, 0, NO_SIDE},
    {"cancel, direct + caller",            1, 1, 1, 1, 1, NO_SIDE},
    {"cancel, threads only",               0, 0, 0, 1, 1, NO_SIDE},
    {"close consumer side, direct+caller", 1, 1, 0, 1, 0, CONSUMER_SIDE},
    {"close producer side, direct+caller", 1, 1, 1, 1, 0, PRODUCER_SIDE},
    {"close consumer side, threads only",  0, 0, 1, 1, 0, CONSUMER_SIDE},
    {"close producer side, threads only",  0, 0, 0, 1, 0, PRODUCER_SIDE},
    /* Credit deferred for a consumer's next read, while another gate's
     * consumer holds the socket and the writer thread sends alone. */
    {"direct reads only",                  1, 0, 0, 2, 0, NO_SIDE},
    {"direct reads only, small buffers",   1, 0, 1, 2, 0, NO_SIDE},
    /* Heartbeats between sessions and after them, with a short I/O timeout. */
    {"quiet, direct + caller",             1, 1, 0, 2, 0, NO_SIDE, 2.5},
};

#define NUM(a) (sizeof(a) / sizeof((a)[0]))

int main(int argc, char **argv)
{
    uint32_t nbuf = argc > 1 ? (uint32_t)atoi(argv[1]) : 300;
    const char *names[] = {"unix", "tcp", "shm", "lend", "sealed"};
    int over = argc > 2 ? -1 : OVER_UNIX;
    pthread_t watchdog;
    for (int i = 0; argc > 2 && i < (int)NUM(names); i++)
        if (strcmp(argv[2], names[i]) == 0)
            over = i;
    if (nbuf < 100 || over < 0 || argc > 3) {
        fprintf(stderr, "usage: %s [buffers per channel >= 100] [unix|tcp|shm|lend|sealed]\n",
                argv[0]);
        return 2;
    }
    CHECK(pthread_create(&watchdog, NULL, watchdog_main, NULL) == 0);
    for (size_t r = 0; r < NUM(ROUNDS); r++)
        run_round(&ROUNDS[r], nbuf, over);
    __atomic_store_n(&g_watchdog_stop, 1, __ATOMIC_RELEASE);
    pthread_join(watchdog, NULL);
    printf("ok\n");
    return 0;
}
