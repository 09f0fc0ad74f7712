/* A connection's side of lending (network/lease.h): buffers of a shared
 * pool go to a peer on this host as BUFFER_LENT frames naming their
 * segment, the peer's RELEASE frames give them back; buffers lent by the
 * peer are read in place from its arena, mapped read-only. */
#define _GNU_SOURCE
#include "network/connection_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fb_conn_lend(fb_conn_t *c, const fb_netpool_t *np, int pidfd, int ledger_fd)
{
    int rc = fb_lent_init(&c->lent, np, ledger_fd);
    if (rc != 0)
        return rc;
    c->lend_np = np;
    c->peer_pidfd = pidfd;
    return 0;
}

/* A held segment of the peer's was recycled (any thread, the lease's lock
 * held): the writer names it in its next RELEASE. */
static void lease_released(void *arg, uint32_t segment)
{
    fb_conn_t *c = arg;
    int32_t n;
    pthread_mutex_lock(&c->rel_mu);
    c->rel[c->nrel] = segment;        /* each segment at most once: held once */
    n = c->nrel + 1;
    __atomic_store_n(&c->nrel, n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rel_mu);
    /* As deferred credit: a consumer that reads the connection itself sends
     * them with its next read, many in one frame, and wakes nobody. */
    if (!consumer_reads(c) || n >= RELEASE_BATCH)
        notify_writer(c, 0);
}

/* A lent segment of `tag` (a channel) was recycled: its credit returns. */
static void lease_untag(void *tag)
{
    fb_inchan_t *ch = tag;
    inchan_return_kept(ch);
    fb_inchan_decref(ch);
}

int fb_conn_borrow(fb_conn_t *c, int memfd, int ledger_fd, char *err, size_t errlen)
{
    fb_lease_t *l = fb_lease_map(memfd, ledger_fd, c->segment_size, err, errlen);
    if (l == NULL)
        return -1;
    c->rel = malloc(sizeof(uint32_t) * (size_t)fb_lease_segments(l));
    if (c->rel == NULL) {
        fb_lease_detach(l);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->lease = l;
    fb_lease_set_release(l, lease_released, c, lease_untag);
    return 0;
}

int32_t fb_conn_lent(fb_conn_t *c)
{
    int32_t n;
    pthread_mutex_lock(&c->mu);
    n = c->lent.count;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int32_t fb_conn_borrowed(fb_conn_t *c)
{
    return c->lease != NULL ? fb_lease_held(c->lease) : 0;
}

int lend_locked(fb_conn_t *c, outchan_t *oc, const fb_item_t *item)
{
    if (item->pool == NULL || item->pool->net != c->lend_np || item->kind != FB_ITEM_DATA)
        return 0;
    fb_lent_put(&c->lent, item->index, item->pool, oc->ref);
    item->pool->ops->release_channel(item->pool, item->index);
    return 1;
}

char *put_releases_locked(fb_conn_t *c, char *p, char *end, int *more)
{
    uint32_t n;
    pthread_mutex_lock(&c->rel_mu);
    while (c->nrel > 0 && end - p >= (ptrdiff_t)FB_NET_MAX_CONTROL_FRAME) {
        n = (uint32_t)c->nrel < RELEASE_BATCH ? (uint32_t)c->nrel : RELEASE_BATCH;
        __atomic_store_n(&c->nrel, c->nrel - (int32_t)n, __ATOMIC_RELAXED);
        p = fb_wire_put_release(p, c->rel + c->nrel, n);
    }
    *more = c->nrel > 0;
    pthread_mutex_unlock(&c->rel_mu);
    return p;
}

/* A lent buffer spends a credit as a copied one does: the segment the
 * credit stood for is kept aside until the lent one is recycled. */
int read_lent(fb_conn_t *c, const fb_wire_frame_t *f)
{
    const fb_wire_lent_t *b = &f->u.lent;
    fb_inchan_t *ch;
    fb_item_t item, credit;
    int rc;
    if (c->lease == NULL)
        return protocol_error(c, "a lent buffer, but no arena of the peer is mapped");
    if (fb_lease_take(c->lease, b->segment, b->size, &item) != 0)
        return protocol_error(c, "a lent buffer in segment %u, which is outside the peer's "
                              "arena or lent already", b->segment);
    ch = buffer_target(c, f->receiver_id, b->sequence, FB_WIRE_DATA, b->size, &credit, &rc);
    if (ch == NULL) {
        fb_item_dispose(&item);               /* released at once */
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    fb_credit_keep(&ch->cr, credit.index, credit.pool != ch->exclusive);
    inchan_incref(ch);                        /* the tag's */
    pthread_mutex_unlock(&c->mu);
    fb_lease_tag(c->lease, b->segment, ch);
    stat_add(&c->stats.frames_in, 1);
    stat_add(&c->stats.buffers_in, 1);
    buffer_deliver(c, ch, &item, 0, (int32_t)b->backlog);
    fb_inchan_decref(ch);
    return 0;
}

int read_release(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint32_t k, segment;
    fb_localpool_t *pool;
    fb_owner_ref_t *ref;
    int rc;
    for (k = 0; k < f->u.release.count; k++) {
        segment = fb_wire_release_segment(&f->u.release, k);
        pthread_mutex_lock(&c->mu);
        rc = c->lend_np != NULL ? fb_lent_take(&c->lent, segment, &pool, &ref) : EPROTO;
        pthread_mutex_unlock(&c->mu);
        if (rc != 0)
            return protocol_error(c, "a release of segment %u, which was not lent", segment);
        pool->ops->recycle(pool, (int32_t)segment);
        fb_owner_ref_put(ref);
    }
    return 0;
}

void lending_detach(fb_conn_t *c)
{
    if (c->lease != NULL) {
        fb_lease_detach(c->lease);     /* waits out a release in progress */
        c->lease = NULL;
    }
}

void lending_end(fb_conn_t *c)
{
    fb_lent_t lent;
    int pidfd, lends;
    pthread_mutex_lock(&c->mu);
    lent = c->lent;
    memset(&c->lent, 0, sizeof(c->lent));
    lends = c->lend_np != NULL;
    pidfd = c->peer_pidfd;
    c->lend_np = NULL;
    c->peer_pidfd = -1;
    pthread_mutex_unlock(&c->mu);
    /* (no lock held: giving segments back runs their pools' recycle hooks) */
    if (lends)
        fb_lent_reap(&lent, pidfd);        /* takes the pidfd, empties the table */
    else if (pidfd >= 0)
        close(pidfd);
    free(c->rel);
    c->rel = NULL;
}
