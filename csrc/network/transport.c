#define _GNU_SOURCE
#include "network/transport.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct socket_transport {
    fb_transport_t base;
    int fd;
} socket_transport_t;

static int fd_of(fb_transport_t *t)
{
    return ((socket_transport_t *)t)->fd;
}

static ssize_t socket_send(fb_transport_t *t, const struct iovec *iov, int iovcnt, int nowait)
{
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = (struct iovec *)iov;
    mh.msg_iovlen = (size_t)iovcnt;
    return sendmsg(fd_of(t), &mh, MSG_NOSIGNAL | (nowait ? MSG_DONTWAIT : 0));
}

static ssize_t socket_recv(fb_transport_t *t, struct iovec *iov, int iovcnt)
{
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)iovcnt;
    return recvmsg(fd_of(t), &mh, MSG_DONTWAIT);
}

static int socket_wait(fb_transport_t *t, int events, int wake_fd, int ms)
{
    struct pollfd p[2] = {{fd_of(t), 0, 0}, {wake_fd, POLLIN, 0}};
    uint64_t drained;
    int rc;
    p[0].events = (short)(((events & FB_TRANSPORT_READABLE) ? POLLIN : 0)
                          | ((events & FB_TRANSPORT_WRITABLE) ? POLLOUT : 0));
    rc = poll(p, wake_fd >= 0 ? 2 : 1, ms);
    if (rc > 0 && wake_fd >= 0 && (p[1].revents & POLLIN))
        (void)!read(wake_fd, &drained, sizeof(drained));
    return rc;
}

static void socket_shutdown(fb_transport_t *t)
{
    int fd = fd_of(t);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

static void socket_close(fb_transport_t *t)
{
    socket_transport_t *s = (socket_transport_t *)t;
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
}

static void socket_destroy(fb_transport_t *t)
{
    socket_close(t);
    free(t);
}

static const fb_transport_ops_t SOCKET_OPS = {
    socket_send, socket_recv, socket_wait, socket_shutdown, socket_close, socket_destroy, NULL,
    NULL, NULL,
};

fb_transport_t *fb_transport_socket(int fd)
{
    socket_transport_t *s = malloc(sizeof(*s));
    if (s == NULL)
        return NULL;
    s->base.ops = &SOCKET_OPS;
    s->fd = fd;
    return &s->base;
}
