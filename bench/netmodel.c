/* bench/netmodel.c: a model of a connection's data path (csrc/network/), to attribute
 * its costs (not flinkbuf: no Python, no serialization; bench/network_profile.py
 * builds and runs it).  Two processes (fork) over loopback
 * TCP or a Unix socket move frames of FB_NET's shape (26-byte header + body).
 *
 *   netmodel KIND FAMILY N HANDOFF BATCH STAGING CREDIT PIN [SOCKBUF]
 *   KIND    bulk (N frames of 32 KiB one way) | ping (N round trips of 16 B)
 *   FAMILY  tcp | uds
 *   HANDOFF 0: the app thread does its own socket I/O (one thread per side);
 *           1: like the engine: the app thread hands buffers to a writer
 *           thread and takes them from a reader thread (mutex + condvars)
 *   BATCH   frames per sendmsg, at most (the engine: 1)
 *   STAGING 1: the reader reads through a 64 KiB staging buffer and copies
 *           the staged part of a body out (the engine); 0: header, then the
 *           body straight into its buffer
 *   CREDIT  1: the consumer grants 10 buffers and announces each recycled
 *           one lazily (ADD_CREDIT when unannounced credit turns positive),
 *           the producer sends only with credit (the engine); 0: no credit
 *   PIN     0: the scheduler decides; 1: both processes on CPU 0; 2: CPU 0 and 1
 *   SOCKBUF SO_SNDBUF and SO_RCVBUF of both sockets (default: the kernel's
 *           autotuning, as the engine)
 *
 * Prints one line: MB/s (bulk) or round-trip p50/p99 (ping), and per side CPU
 * time, voluntary+involuntary context switches and sendmsg/recv calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HDR 26
#define RD_CAP 65536
#define NBUF 16
#define CREDIT0 10
#define MAXB 64

static int kind_bulk, handoff, batch, staging, use_credit, sockbuf;
static long nframes;
static size_t body;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    int64_t t0, t_end, cpu_ns[2], csw[2], sends[2], recvs[2];
    int64_t rtt[];
} shared_t;

static shared_t *sh;

/* ---- socket I/O ------------------------------------------------------------------ */

static __thread int64_t n_send, n_recv;
static int64_t tot_send, tot_recv;
static pthread_mutex_t tot_mu = PTHREAD_MUTEX_INITIALIZER;

static void add_totals(void)
{
    pthread_mutex_lock(&tot_mu);
    tot_send += n_send;
    tot_recv += n_recv;
    pthread_mutex_unlock(&tot_mu);
}

static void send_iov(int fd, struct iovec *iov, int cnt)
{
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    while (cnt > 0) {
        ssize_t r;
        mh.msg_iov = iov;
        mh.msg_iovlen = cnt;
        r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        n_send++;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            perror("sendmsg");
            exit(1);
        }
        while (cnt > 0 && (size_t)r >= iov->iov_len) {
            r -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= r;
        }
    }
}

static size_t recv_some(int fd, char *dst, size_t n)
{
    ssize_t r;
    for (;;) {
        r = recv(fd, dst, n, 0);
        n_recv++;
        if (r > 0)
            return (size_t)r;
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return 0;
        perror("recv");
        exit(1);
    }
}

static int recv_all(int fd, char *dst, size_t n)
{
    while (n > 0) {
        size_t r = recv_some(fd, dst, n);
        if (r == 0)
            return -1;
        dst += r;
        n -= r;
    }
    return 0;
}

/* The frame reader: through staging (the engine's read_frame) or direct. */
typedef struct {
    int fd;
    char *rd;
    size_t pos, end;
} reader_t;

static int rd_fill(reader_t *r, size_t n)
{
    if (r->end - r->pos >= n)
        return 0;
    memmove(r->rd, r->rd + r->pos, r->end - r->pos);
    r->end -= r->pos;
    r->pos = 0;
    while (r->end < n) {
        size_t got = recv_some(r->fd, r->rd + r->end, RD_CAP - r->end);
        if (got == 0)
            return -1;
        r->end += got;
    }
    return 0;
}

/* Read one header: type (0 data, 6 credit) and size/credit.  -1 at EOF. */
static int read_header(reader_t *r, int *type, uint32_t *size)
{
    char h[HDR], *p = h;
    if (staging) {
        if (rd_fill(r, HDR) < 0)
            return -1;
        p = r->rd + r->pos;
        r->pos += HDR;
    } else if (recv_all(r->fd, h, HDR) < 0) {
        return -1;
    }
    *type = (uint8_t)p[8];
    memcpy(size, p + 22, 4);
    return 0;
}

static int read_body(reader_t *r, char *dst, size_t n)
{
    if (staging) {
        size_t have = r->end - r->pos;
        if (have > n)
            have = n;
        memcpy(dst, r->rd + r->pos, have);
        r->pos += have;
        dst += have;
        n -= have;
    }
    return recv_all(r->fd, dst, n);
}

static void put_header(char *h, int type, uint32_t size)
{
    uint32_t len = HDR + (type == 0 ? size : 0);
    memset(h, 0, HDR);
    memcpy(h, &len, 4);
    memcpy(h + 4, "FBUF", 4);
    h[8] = (char)type;
    memcpy(h + 22, &size, 4);
}

/* ---- a side of the connection (HANDOFF 1) -------------------------------------------- */

typedef struct {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t wcv, acv, rcv;
    /* to send */
    char *out[NBUF];
    int nout;
    char *txfree[NBUF];
    int ntxfree;
    int credit;             /* granted by the peer */
    int unannounced, credit_queued;
    /* received */
    char *in[NBUF];
    int nin;
    char *rxfree[NBUF];
    int nrxfree;
    int stop;
} side_t;

static void side_init(side_t *s, int fd)
{
    int k;
    memset(s, 0, sizeof(*s));
    s->fd = fd;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    pthread_cond_init(&s->acv, NULL);
    pthread_cond_init(&s->rcv, NULL);
    for (k = 0; k < NBUF; k++)
        s->txfree[s->ntxfree++] = aligned_alloc(4096, 32768);
    for (k = 0; k < (use_credit ? CREDIT0 : NBUF); k++)
        s->rxfree[s->nrxfree++] = aligned_alloc(4096, 32768);
    s->credit = use_credit ? CREDIT0 : 1 << 30;
}

static void *writer_main(void *arg)
{
    side_t *s = arg;
    char hdrs[MAXB + 1][HDR];
    struct iovec iov[2 * MAXB + 1];
    char *bufs[MAXB];
    for (;;) {
        int k = 0, nb = 0, ctl = 0, cnt = 0;
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->credit_queued && !(s->nout > 0 && s->credit > 0))
            pthread_cond_wait(&s->wcv, &s->mu);
        if (s->stop && !s->credit_queued && s->nout == 0) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (s->credit_queued) {
            put_header(hdrs[MAXB], 6, (uint32_t)s->unannounced);
            s->unannounced = 0;
            s->credit_queued = 0;
            ctl = 1;
        }
        while (nb < batch && s->nout > 0 && s->credit > 0) {
            bufs[nb++] = s->out[0];
            memmove(s->out, s->out + 1, sizeof(char *) * --s->nout);
            s->credit--;
        }
        pthread_mutex_unlock(&s->mu);
        if (ctl) {
            iov[cnt].iov_base = hdrs[MAXB];
            iov[cnt++].iov_len = HDR;
            if (batch == 1) {       /* the engine: control frames on their own */
                send_iov(s->fd, iov, cnt);
                cnt = 0;
            }
        }
        for (k = 0; k < nb; k++) {
            put_header(hdrs[k], 0, (uint32_t)body);
            iov[cnt].iov_base = hdrs[k];
            iov[cnt++].iov_len = HDR;
            iov[cnt].iov_base = bufs[k];
            iov[cnt++].iov_len = body;
        }
        if (cnt)
            send_iov(s->fd, iov, cnt);
        if (nb) {
            pthread_mutex_lock(&s->mu);
            for (k = 0; k < nb; k++)
                s->txfree[s->ntxfree++] = bufs[k];
            pthread_cond_signal(&s->acv);
            pthread_mutex_unlock(&s->mu);
        }
    }
    add_totals();
    return NULL;
}

static void *reader_main(void *arg)
{
    side_t *s = arg;
    reader_t r = {s->fd, malloc(RD_CAP), 0, 0};
    int type;
    uint32_t size;
    while (read_header(&r, &type, &size) == 0) {
        if (type == 6) {
            pthread_mutex_lock(&s->mu);
            s->credit += (int)size;
            pthread_cond_signal(&s->wcv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        char *buf;
        pthread_mutex_lock(&s->mu);
        while (s->nrxfree == 0)
            pthread_cond_wait(&s->rcv, &s->mu);
        buf = s->rxfree[--s->nrxfree];
        pthread_mutex_unlock(&s->mu);
        if (read_body(&r, buf, size) < 0)
            break;
        pthread_mutex_lock(&s->mu);
        s->in[s->nin++] = buf;
        pthread_cond_signal(&s->acv);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->acv);
    pthread_mutex_unlock(&s->mu);
    free(r.rd);
    add_totals();
    return NULL;
}

/* app side: a free tx buffer (waits), then queue it for the writer */
static char *tx_get(side_t *s)
{
    char *b;
    pthread_mutex_lock(&s->mu);
    while (s->ntxfree == 0)
        pthread_cond_wait(&s->acv, &s->mu);
    b = s->txfree[--s->ntxfree];
    pthread_mutex_unlock(&s->mu);
    return b;
}

static void tx_put(side_t *s, char *b)
{
    pthread_mutex_lock(&s->mu);
    s->out[s->nout++] = b;
    pthread_cond_signal(&s->wcv);
    pthread_mutex_unlock(&s->mu);
}

static char *rx_take(side_t *s)
{
    char *b = NULL;
    pthread_mutex_lock(&s->mu);
    while (s->nin == 0 && !s->stop)
        pthread_cond_wait(&s->acv, &s->mu);
    if (s->nin > 0) {
        b = s->in[0];
        memmove(s->in, s->in + 1, sizeof(char *) * --s->nin);
    }
    pthread_mutex_unlock(&s->mu);
    return b;
}

static void rx_recycle(side_t *s, char *b)
{
    pthread_mutex_lock(&s->mu);
    s->rxfree[s->nrxfree++] = b;
    pthread_cond_signal(&s->rcv);
    if (use_credit) {
        s->unannounced++;
        if (!s->credit_queued) {
            s->credit_queued = 1;
            pthread_cond_signal(&s->wcv);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- the two processes ------------------------------------------------------------------ */

static char *src, *sink;

static void produce_direct(int fd)
{
    char h[HDR], *buf = aligned_alloc(4096, 32768);
    struct iovec iov[2];
    long i;
    for (i = 0; i < nframes; i++) {
        memcpy(buf, src, body);                 /* the records into the buffer */
        put_header(h, 0, (uint32_t)body);
        iov[0].iov_base = h;
        iov[0].iov_len = HDR;
        iov[1].iov_base = buf;
        iov[1].iov_len = body;
        send_iov(fd, iov, 2);
    }
}

static void consume_direct(int fd)
{
    reader_t r = {fd, malloc(RD_CAP), 0, 0};
    char *buf = aligned_alloc(4096, 32768);
    int type;
    uint32_t size;
    long i;
    for (i = 0; i < nframes; i++) {
        if (read_header(&r, &type, &size) < 0 || read_body(&r, buf, size) < 0)
            exit(2);
        memcpy(sink, buf, size);                /* the records out of it */
    }
}

static void rusage_into(int k)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    sh->cpu_ns[k] = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL
                    + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
    sh->csw[k] = ru.ru_nvcsw + ru.ru_nivcsw;
}

/* role 0: producer / pinger (connects); role 1: consumer / ponger (accepts) */
static void run(int role, int fd)
{
    side_t s;
    pthread_t wt, rt;
    char go = 'g';
    long i;
    if (role == 1) {
        if (write(fd, &go, 1) != 1)
            exit(3);
    } else if (read(fd, &go, 1) != 1) {
        exit(3);
    }
    if (handoff) {
        side_init(&s, fd);
        pthread_create(&wt, NULL, writer_main, &s);
        pthread_create(&rt, NULL, reader_main, &s);
    }
    if (kind_bulk && role == 0) {
        sh->t0 = now_ns();
        if (!handoff) {
            produce_direct(fd);
        } else {
            for (i = 0; i < nframes; i++) {
                char *b = tx_get(&s);
                memcpy(b, src, body);
                tx_put(&s, b);
            }
        }
    } else if (kind_bulk) {
        if (!handoff) {
            consume_direct(fd);
        } else {
            for (i = 0; i < nframes; i++) {
                char *b = rx_take(&s);
                if (b == NULL)
                    exit(4);
                memcpy(sink, b, body);
                rx_recycle(&s, b);
            }
        }
        sh->t_end = now_ns();
    } else {
        /* ping: role 0 sends and waits; role 1 echoes */
        reader_t r = {fd, malloc(RD_CAP), 0, 0};
        char h[HDR], buf[64];
        struct iovec iov[2];
        int type;
        uint32_t size;
        for (i = 0; i < nframes; i++) {
            int64_t t = now_ns();
            if (role == 1)
                goto receive;
send:
            if (!handoff) {
                put_header(h, 0, (uint32_t)body);
                iov[0].iov_base = h;
                iov[0].iov_len = HDR;
                iov[1].iov_base = buf;
                iov[1].iov_len = body;
                send_iov(fd, iov, 2);
            } else {
                char *b = tx_get(&s);
                memcpy(b, buf, body);
                tx_put(&s, b);
            }
            if (role == 1)
                continue;
receive:
            if (!handoff) {
                if (read_header(&r, &type, &size) < 0 || read_body(&r, buf, size) < 0)
                    exit(2);
            } else {
                char *b = rx_take(&s);
                if (b == NULL)
                    exit(4);
                memcpy(buf, b, body);
                rx_recycle(&s, b);
            }
            if (role == 1)
                goto send;
            sh->rtt[i] = now_ns() - t;
        }
        free(r.rd);
    }
    if (handoff) {
        /* the producer's last frames out, then EOF both ways */
        pthread_mutex_lock(&s.mu);
        while (s.nout > 0)
            pthread_cond_wait(&s.acv, &s.mu);
        s.stop = 1;
        pthread_cond_broadcast(&s.wcv);
        pthread_mutex_unlock(&s.mu);
        pthread_join(wt, NULL);
        shutdown(fd, SHUT_WR);
        pthread_join(rt, NULL);
    } else {
        shutdown(fd, SHUT_WR);
        while (recv(fd, &go, 1, 0) > 0)
            ;
    }
    add_totals();
    rusage_into(role);
    sh->sends[role] = tot_send;
    sh->recvs[role] = tot_recv;
}

static void tune(int fd)
{
    if (sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    }
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int family, pin, srv, fd, one = 1;
    pid_t child;
    struct sockaddr_in in4;
    struct sockaddr_un un;
    socklen_t alen;
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: netmodel bulk|ping tcp|uds N HANDOFF BATCH STAGING CREDIT PIN "
                "[SOCKBUF]\n");
        return 2;
    }
    sockbuf = argc == 10 ? atoi(argv[9]) : 0;
    kind_bulk = strcmp(argv[1], "bulk") == 0;
    family = strcmp(argv[2], "uds") == 0 ? AF_UNIX : AF_INET;
    nframes = atol(argv[3]);
    handoff = atoi(argv[4]);
    batch = atoi(argv[5]);
    if (batch < 1 || batch > MAXB)
        batch = 1;
    staging = atoi(argv[6]);
    use_credit = atoi(argv[7]);
    pin = atoi(argv[8]);
    body = kind_bulk ? 32768 : 16;
    sh = mmap(NULL, sizeof(shared_t) + sizeof(int64_t) * nframes, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    src = aligned_alloc(4096, 32768);
    sink = aligned_alloc(4096, 32768);
    memset(src, 0xab, 32768);
    memset(sink, 0, 32768);
    srv = socket(family, SOCK_STREAM, 0);
    if (family == AF_INET) {
        memset(&in4, 0, sizeof(in4));
        in4.sin_family = AF_INET;
        in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bind(srv, (struct sockaddr *)&in4, sizeof(in4));
        alen = sizeof(in4);
        getsockname(srv, (struct sockaddr *)&in4, &alen);
    } else {
        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "netmodel-%d", getpid());
        alen = offsetof(struct sockaddr_un, sun_path) + 1 + strlen(un.sun_path + 1);
        bind(srv, (struct sockaddr *)&un, alen);
    }
    listen(srv, 1);
    child = fork();
    if (pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(pin == 2 && child != 0 ? 1 : 0, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
    if (child == 0) {
        close(srv);
        fd = socket(family, SOCK_STREAM, 0);
        if (family == AF_INET) {
            connect(fd, (struct sockaddr *)&in4, sizeof(in4));
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        } else {
            connect(fd, (struct sockaddr *)&un, alen);
        }
        tune(fd);
        run(0, fd);
        _exit(0);
    }
    fd = accept(srv, NULL, NULL);
    if (family == AF_INET)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    tune(fd);
    run(1, fd);
    waitpid(child, NULL, 0);
    printf("%s %s handoff=%d batch=%d staging=%d credit=%d pin=%d sockbuf=%d: ", argv[1],
           argv[2], handoff, batch, staging, use_credit, pin, sockbuf);
    if (kind_bulk) {
        double s = (sh->t_end - sh->t0) / 1e9;
        printf("%7.0f MB/s", nframes * 32768.0 / s / 1e6);
    } else {
        long skip = nframes / 10;
        qsort(sh->rtt + skip, nframes - skip, sizeof(int64_t), cmp64);
        printf("rtt p50 %6.1f us p99 %6.1f us", sh->rtt[skip + (nframes - skip) / 2] / 1e3,
               sh->rtt[skip + (long)((nframes - skip) * 0.99)] / 1e3);
    }
    printf("  | per frame: producer %.2f csw %.2f send %.2f recv, consumer %.2f csw %.2f send "
           "%.2f recv; cpu %.2f + %.2f s\n",
           (double)sh->csw[0] / nframes, (double)sh->sends[0] / nframes,
           (double)sh->recvs[0] / nframes, (double)sh->csw[1] / nframes,
           (double)sh->sends[1] / nframes, (double)sh->recvs[1] / nframes, sh->cpu_ns[0] / 1e9,
           sh->cpu_ns[1] / 1e9);
    return 0;
}
