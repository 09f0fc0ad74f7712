/* The producer's side of a connection: serving subpartitions of this
 * process to the peer (Flink's PartitionRequestServerHandler and
 * PartitionRequestQueue): partition requests and their budget, the credit
 * the reader grants, the buffer sizes it announces (and their budget), what
 * a served channel sends next, and lending: over
 * shared memory, buffers of a shared pool go to the peer as BUFFER_LENT
 * frames naming their segment (network/lease.h), its RELEASE frames give
 * them back, and the connection's end gives back the rest. */
#define _GNU_SOURCE
#include "network/producer_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- served channels ------------------------------------------------------- */

void outchan_free_slot(fb_conn_t *c, outchan_t *oc)
{
    idmap_del(&c->out_ids, oc->receiver_id);
    c->outs[oc->slot] = NULL;
    c->free_outs[c->nfree_outs++] = oc->slot;
}

void outchan_end(fb_conn_t *c, outchan_t *oc, int release)
{
    fb_item_t *items = NULL;
    int32_t n;
    fb_subpart_disconnect(oc->sp, &c->out);
    if (oc->pool_waiter)
        oc->pool->ops->clear_waiter(oc->pool, c);
    if (release) {
        n = fb_subpart_terminate(oc->sp, FB_SP_RELEASED, &items);
        if (n > 0)
            fb_items_dispose(items, n);
    }
    fb_owner_ref_put(oc->ref);       /* the owner goes once nothing of it is lent */
    free(oc);
}

/* ---- partition requests ---------------------------------------------------- */

int64_t producer_request_wait(fb_conn_t *c, int64_t now)
{
    /* A request costs this side a lookup in the owner's code and an answer;
     * a peer that sends more than the budget finds its frames waiting in
     * its socket (GCRA: rq_tat is when the budget is full again). */
    const int64_t interval = 1000000000LL / REQUEST_RATE;
    int64_t tat = c->rq_tat > now ? c->rq_tat : now;
    if (tat - now > (int64_t)REQUEST_BURST * interval)
        return tat - now - (int64_t)REQUEST_BURST * interval;
    c->rq_tat = tat + interval;
    return 0;
}

/* A new served channel on `slot`-to-be for the found subpartition (mu held):
 * 0, or an FB_NET_ERR_* code with why in err. */
static int serve_locked(fb_conn_t *c, const fb_wire_frame_t *f, fb_subpart_t *sp, void *owner,
                        fb_localpool_t *pool, char *err, size_t errlen)
{
    uint32_t id = f->receiver_id;
    uint16_t idl = f->u.request.id_len;
    int32_t slot;
    outchan_t *oc;
    if (c->state != CONN_OPEN || c->nfree_outs == 0 || idmap_get(&c->out_ids, id) >= 0
            || (oc = calloc(1, sizeof(*oc))) == NULL) {
        snprintf(err, errlen, "the request cannot be served now");
        return FB_NET_ERR_REFUSED;
    }
    if ((oc->ref = fb_owner_ref_new(owner, c->cb.release_owner, c->cb.ctx)) == NULL) {
        free(oc);
        snprintf(err, errlen, "the request cannot be served now");
        return FB_NET_ERR_REFUSED;
    }
    slot = c->free_outs[--c->nfree_outs];
    oc->receiver_id = id;
    oc->slot = slot;
    oc->sp = sp;
    oc->owner = owner;
    oc->pool = pool;
    oc->credit = f->u.request.credit;
    oc->event_credit = FB_NET_EVENT_WINDOW;
    oc->lends = c->lend_np != NULL && pool != NULL && pool->net == c->lend_np;
    if (fb_subpart_connect(sp, &c->out, slot) != FB_OK) {
        c->free_outs[c->nfree_outs++] = slot;
        free(oc->ref);                /* (its owner reference is dropped by the caller) */
        free(oc);
        snprintf(err, errlen, "subpartition %u of partition %.*s already has a reader "
                 "or was released", f->u.request.subpartition, (int)(idl > 200 ? 200 : idl),
                 f->u.request.partition_id);
        return FB_NET_ERR_REFUSED;
    }
    /* The producer waiting for a buffer of this pool reads this connection
     * itself (pool_wait), if no other connection does. */
    if (pool != NULL && c->direct_reads && c->caller_sends) {
        fb_lender_t w = {c->pool_lender, conn_hold, conn_release, c};
        oc->pool_waiter = pool->ops->set_waiter(pool, &w);
    }
    c->outs[slot] = oc;
    idmap_put(&c->out_ids, id, slot);
    return 0;
}

void producer_request(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint32_t id = f->receiver_id;
    uint16_t idl = f->u.request.id_len;
    int rc;
    fb_subpart_t *sp = NULL;
    void *owner = NULL;
    fb_localpool_t *pool = NULL;
    char pid[FB_NET_MAX_PARTITION_ID], err[512];
    memcpy(pid, f->u.request.partition_id, idl);
    pthread_mutex_lock(&c->mu);
    /* The peer does not read our answers: the reader thread waits for room
     * (a direct reader left such a request to it, read_step). */
    while (c->nctl >= CTL_MAX && c->state == CONN_OPEN && c->rd_owner == RD_THREAD)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = c->state != CONN_OPEN ? -1
         : idmap_get(&c->out_ids, id) >= 0 ? 1
         : c->nfree_outs == 0 ? 2 : 0;
    if (rc == 1)
        ctl_error(c, id, FB_NET_ERR_REFUSED, "ValueError", "the receiver id is in use");
    else if (rc == 2)
        ctl_error(c, id, FB_NET_ERR_REFUSED, "ValueError",
                  "too many channels on this connection");
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return;
    err[0] = '\0';
    rc = c->cb.find_subpartition(c->cb.ctx, pid, idl, f->u.request.subpartition, &sp, &owner,
                                 &pool, err, sizeof(err));
    pthread_mutex_lock(&c->mu);
    if (rc == 0 && (rc = serve_locked(c, f, sp, owner, pool, err, sizeof(err))) == 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (c->state == CONN_OPEN)
        ctl_error(c, id, rc, rc == FB_NET_ERR_NOT_FOUND ? "PartitionNotFoundError" : "ValueError",
                  err);
    pthread_mutex_unlock(&c->mu);
    if (owner != NULL)
        c->cb.release_owner(c->cb.ctx, owner);
}

/* ---- credit ------------------------------------------------------------------ */

int producer_credit(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
{
    uint8_t msg = f->msg;
    uint32_t id = f->receiver_id;
    int32_t n = f->u.credit, slot;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    slot = idmap_get(&c->out_ids, id);
    if (slot >= 0) {
        outchan_t *oc = c->outs[slot];
        /* The writer parks a channel only for want of credit: a grant
         * on top of credit it still had changes nothing for it. */
        wake = msg == FB_MSG_CANCEL
               || ((msg == FB_MSG_ADD_CREDIT ? oc->credit : oc->event_credit) <= 0
                   && fb_subpart_size(oc->sp) > 0);
        if (msg == FB_MSG_CANCEL) {
            oc->cancelled = 1;
        } else if (msg == FB_MSG_ADD_EVENT_CREDIT) {
            if ((int64_t)oc->event_credit + n > FB_NET_EVENT_WINDOW) {
                pthread_mutex_unlock(&c->mu);
                snprintf(why, WHY_LEN, "event credit beyond the window on receiver id %u", id);
                return -1;
            }
            oc->event_credit += n;
        } else if ((int64_t)oc->credit + n > INT32_MAX) {
            pthread_mutex_unlock(&c->mu);
            snprintf(why, WHY_LEN, "credit overflow on receiver id %u", id);
            return -1;
        } else {
            oc->credit += n;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (wake && c->caller_sends
            && __atomic_load_n(&c->rd_owner, __ATOMIC_RELAXED) == RD_DIRECT)
        send_now(c, slot);            /* a thread reading for itself sends too */
    else if (wake)
        notify_writer(c, slot);
    stat_add(&c->stats.frames_in, 1);
    return 0;
}

/* ---- buffer sizes (buffer debloating) ------------------------------------------ */

/* One more NEW_BUFFER_SIZE on a served channel (mu held): 0 within the
 * peer's budget (GCRA, as its partition requests), -1 past it. */
static int size_budget_locked(outchan_t *oc, int64_t now)
{
    int64_t tat = oc->size_tat > now ? oc->size_tat : now;
    if (tat - now > (int64_t)(SIZE_BURST - 1) * SIZE_INTERVAL_NS)
        return -1;
    oc->size_tat = tat + SIZE_INTERVAL_NS;
    return 0;
}

int producer_buffer_size(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
{
    uint32_t id = f->receiver_id;
    int32_t slot;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    slot = idmap_get(&c->out_ids, id);
    if (slot >= 0) {                 /* (a channel that ended: ignored, as its credit) */
        outchan_t *oc = c->outs[slot];
        rc = size_budget_locked(oc, fb_monotonic_ns());
        if (rc == 0)
            fb_subpart_set_buffer_size(oc->sp, f->u.buffer_size);
    }
    pthread_mutex_unlock(&c->mu);
    if (rc < 0) {
        snprintf(why, WHY_LEN, "buffer sizes on receiver id %u faster than %d at once and "
                 "%lld a second", id, SIZE_BURST, 1000000000LL / SIZE_INTERVAL_NS);
        return -1;
    }
    stat_add(&c->stats.frames_in, 1);
    return 0;
}

/* ---- what a served channel sends --------------------------------------------- */

/* A lent buffer spends a credit as a copied one does (mu held): 1 if the
 * item is lent (recorded until released), 0 to copy it. */
static int lend_locked(fb_conn_t *c, outchan_t *oc, const fb_item_t *item)
{
    if (item->pool == NULL || c->state != CONN_OPEN || item->pool->net != c->lend_np
            || item->kind != FB_ITEM_DATA)
        return 0;
    fb_lent_put(&c->lent, item->index, item->pool, oc->ref);
    item->pool->ops->release_channel(item->pool, item->index);
    return 1;
}

/* The producer failed, or released its partition (no lock held, oc's slot
 * freed): tell the reader (after what is sent for it: the error is queued). */
static void tell_ended(fb_conn_t *c, outchan_t *oc, int rc)
{
    char type[FB_NET_MAX_ERROR_TYPE] = "", msg[FB_NET_MAX_MESSAGE] = "the partition was released";
    if (rc == FB_EFAILED)
        c->cb.describe_failure(c->cb.ctx, oc->owner, type, sizeof(type), msg, sizeof(msg));
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN)
        ctl_error(c, oc->receiver_id,
                  rc == FB_EFAILED ? FB_NET_ERR_PRODUCER_FAILED : FB_NET_ERR_RELEASED, type, msg);
    pthread_mutex_unlock(&c->mu);
    outchan_end(c, oc, 0);
}

int producer_take(fb_conn_t *c, int32_t slot, frame_t *fr)
{
    outchan_t *oc;
    int rc, last = 0;
    pthread_mutex_lock(&c->mu);
    oc = c->outs[slot];
    if (oc == NULL) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (oc->cancelled) {
        outchan_free_slot(c, oc);
        pthread_mutex_unlock(&c->mu);
        outchan_end(c, oc, 1);
        return 0;
    }
    rc = fb_subpart_poll_credit(oc->sp, oc->credit, oc->event_credit, &fr->item, &last);
    if (rc == FB_EMPTY) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (rc != FB_OK) {
        outchan_free_slot(c, oc);
        pthread_mutex_unlock(&c->mu);
        tell_ended(c, oc, rc);
        return 0;
    }
    fr->lent = oc->lends && lend_locked(c, oc, &fr->item);
    if (fr->lent)
        fb_wire_put_lent(fr->hdr, oc->receiver_id, oc->seq++, fb_subpart_backlog(oc->sp),
                         (uint32_t)fr->item.size, (uint32_t)fr->item.index);
    else
        fb_wire_put_buffer(fr->hdr, oc->receiver_id, oc->seq++, fb_subpart_backlog(oc->sp),
                           fr->item.kind == FB_ITEM_DATA ? FB_WIRE_DATA : FB_WIRE_EVENT,
                           (uint32_t)fr->item.size);
    if (fr->item.kind != FB_ITEM_DATA)
        oc->event_credit--;
    else
        oc->credit--;                /* lent or copied: a credit each */
    fr->ended = NULL;
    if (last) {                      /* its last item: the channel ends once it is sent */
        outchan_free_slot(c, oc);
        fr->ended = oc;
    }
    pthread_mutex_unlock(&c->mu);
    return 1;
}

/* ---- lending ------------------------------------------------------------------ */

int fb_conn_lend(fb_conn_t *c, const fb_netpool_t *np, int pidfd, int ledger_fd)
{
    int rc = fb_lent_init(&c->lent, np, ledger_fd);
    if (rc != 0)
        return rc;
    c->lend_np = np;
    c->peer_pidfd = pidfd;
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

int producer_release(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
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
        if (rc != 0) {
            snprintf(why, WHY_LEN, "a release of segment %u, which was not lent", segment);
            return -1;
        }
        pool->ops->recycle(pool, (int32_t)segment);
        fb_owner_ref_put(ref);
    }
    return 0;
}

/* Take the table of lent segments out of the connection (mu held): nothing
 * more is lent or released on it. */
static fb_lent_t take_lent_locked(fb_conn_t *c)
{
    fb_lent_t lent = c->lent;
    memset(&c->lent, 0, sizeof(c->lent));
    c->lend_np = NULL;
    return lent;
}

void producer_reclaim(fb_conn_t *c)
{
    fb_lent_t lent;
    pthread_mutex_lock(&c->mu);
    if (c->lend_np == NULL || c->state == CONN_OPEN
            || !(__atomic_load_n(&c->peer_ended, __ATOMIC_ACQUIRE)
                 || fb_lent_let_go(&c->lent))) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    lent = take_lent_locked(c);
    pthread_mutex_unlock(&c->mu);
    /* (no lock held: giving segments back runs their pools' recycle hooks) */
    fb_lent_give_back_all(&lent);
    fb_lent_free(&lent);
}

void producer_lending_end(fb_conn_t *c)
{
    fb_lent_t lent;
    int pidfd, lends;
    pthread_mutex_lock(&c->mu);
    lends = c->lend_np != NULL;
    lent = take_lent_locked(c);
    pidfd = c->peer_pidfd;
    c->peer_pidfd = -1;
    pthread_mutex_unlock(&c->mu);
    if (lends)
        fb_lent_reap(&lent, pidfd);        /* takes the pidfd, empties the table */
    else if (pidfd >= 0)
        close(pidfd);
}
