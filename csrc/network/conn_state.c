/* The state both sides of a connection share (conn_internal.h): its
 * tables (receiver id -> slot), its control queue, waking its writer, and
 * its references. */
#define _GNU_SOURCE
#include "network/conn_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline uint32_t id_home(uint32_t id)
{
    return (id * 2654435761u) & (IDMAP_SIZE - 1);
}

void idmap_init(idmap_t *m)
{
    size_t i;
    for (i = 0; i < IDMAP_SIZE; i++)
        m->key[i] = NO_ID;
}

int32_t idmap_get(const idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id);
    if (id == NO_ID)
        return -1;
    while (m->key[i] != NO_ID) {
        if (m->key[i] == id)
            return m->slot[i];
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    return -1;
}

/* The table holds at most FB_NET_MAX_CHANNELS keys: never full. */
void idmap_put(idmap_t *m, uint32_t id, int32_t slot)
{
    uint32_t i = id_home(id);
    while (m->key[i] != NO_ID && m->key[i] != id)
        i = (i + 1) & (IDMAP_SIZE - 1);
    m->key[i] = id;
    m->slot[i] = slot;
}

void idmap_del(idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id), j, h;
    while (m->key[i] != id) {
        if (m->key[i] == NO_ID)
            return;
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    /* Shift back the entries after i whose home is not in (i, j]. */
    for (j = (i + 1) & (IDMAP_SIZE - 1); m->key[j] != NO_ID; j = (j + 1) & (IDMAP_SIZE - 1)) {
        h = id_home(m->key[j]);
        if (((j - h) & (IDMAP_SIZE - 1)) >= ((j - i) & (IDMAP_SIZE - 1))) {
            m->key[i] = m->key[j];
            m->slot[i] = m->slot[j];
            i = j;
        }
    }
    m->key[i] = NO_ID;
}

int32_t in_lookup(fb_conn_t *c, uint32_t id)
{
    return idmap_get(&c->in_ids, id);
}

void notify_writer(fb_conn_t *c, int32_t slot)
{
    fb_gate_notify(&c->out, slot);
}

void send_now(fb_conn_t *c, int32_t slot)
{
    fb_gate_mark(&c->out, slot);
    c->hook.ready(c->hook.arg);
}

void writer_kick(fb_conn_t *c, int how)
{
    if (c->caller_sends && how == 1)
        send_now(c, 0);
    else
        notify_writer(c, 0);
}

void inchan_incref(fb_inchan_t *ch)
{
    __atomic_add_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL);
}

/* Free control messages (no lock needed: they are values). */
void ctl_free_list(ctl_t *m)
{
    ctl_t *next;
    for (; m != NULL; m = next) {
        next = m->next;
        free(m);
    }
}

int ctl_push_quiet(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                   uint32_t len, int quiet)
{
    ctl_t *m = malloc(sizeof(ctl_t) + len);
    if (m == NULL)
        return FB_ENOMEM;
    m->next = NULL;
    m->type = type;
    m->receiver_id = receiver_id;
    m->len = len;
    if (len)
        memcpy(m->body, body, len);
    if (c->ctl_tail)
        c->ctl_tail->next = m;
    else
        c->ctl_head = m;
    c->ctl_tail = m;
    __atomic_store_n(&c->nctl, c->nctl + 1, __ATOMIC_RELAXED);   /* (read unlocked) */
    if (!quiet)
        notify_writer(c, 0);        /* (woken under mu, the writer would at once block on it) */
    return FB_OK;
}

int ctl_push(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
             uint32_t len)
{
    return ctl_push_quiet(c, type, receiver_id, body, len, 0);
}

/* An ERROR_RESPONSE body: code, type name, message. */
int ctl_error(fb_conn_t *c, uint32_t receiver_id, int code, const char *type,
              const char *msg)
{
    char body[FB_NET_MAX_ERROR_BODY];
    char *end = fb_wire_put_error_body(body, receiver_id, (uint8_t)code, type, strlen(type), msg,
                                       strlen(msg));
    return ctl_push(c, FB_MSG_ERROR, receiver_id, body, (uint32_t)(end - body));
}

void close_socket(fb_conn_t *c)
{
    c->t->ops->shutdown(c->t);
    fb_gate_close(&c->out);
}

void conn_hold(void *arg)
{
    fb_conn_incref(arg);
}

void conn_release(void *arg)
{
    fb_conn_decref(arg);
}

void fb_conn_incref(fb_conn_t *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
}

/* The last reference: its memory goes (the owner closed it: its threads
 * are gone, its channels ended, its descriptors closed). */
static void conn_free(fb_conn_t *c)
{
    ctl_free_list(c->ctl_head);     /* holds no channel: a channel holds this connection */
    fb_gate_free(&c->out);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->rd_cv);
    pthread_cond_destroy(&c->rd_done_cv);
    pthread_mutex_destroy(&c->rd_mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->rel_mu);
    c->t->ops->destroy(c->t);
    fb_frame_reader_free(&c->fr);
    free(c->direct);
    free(c->ctlbuf);
    free(c);
}

void fb_conn_decref(fb_conn_t *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
#ifdef FLINKBUF_DEBUG
    if (!c->closed)
        abort();                    /* the owner drops its reference after fb_conn_close */
#endif
    conn_free(c);
}
