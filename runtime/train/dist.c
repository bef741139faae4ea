/*
 * The ranks of a data-parallel run (dragon/dist.h): the environment, and
 * the TCP rendezvous. Rank 0 holds one connection to every other rank (a
 * star: the rendezvous carries a few hundred bytes a check, never
 * gradients, which go through NCCL); every call is a fixed exchange over
 * it, with a deadline, so a rank that is gone is an error naming it, not
 * a hang.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/msg.h"
#include "dragon/dist.h"

/* How long one exchange may wait for a peer (a rank that stalls longer
 * is taken for gone). */
#define EXCHANGE_S 600.0

static dg_status env_int(const char *name, int lo, int hi, int dflt, int *out, char *msg, size_t size)
{
	const char *v = getenv(name);
	if (!v || !*v) {
		*out = dflt;
		return DG_OK;
	}
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s=%s: must be a whole number from %d to %d", name, v, lo,
				hi);
	*out = (int)x;
	return DG_OK;
}

dg_status dg_dist_from_env(dg_dist *d, char *msg, size_t size)
{
	if (!d)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_dist_from_env: NULL argument");
	memset(d, 0, sizeof(*d));
	dg_status st = env_int("WORLD_SIZE", 1, 1 << 16, 1, &d->world, msg, size);
	if (!st)
		st = env_int("RANK", 0, d->world - 1, 0, &d->rank, msg, size);
	if (!st)
		st = env_int("LOCAL_RANK", 0, 1 << 16, d->rank, &d->local_rank, msg, size);
	if (!st)
		st = env_int("MASTER_PORT", 1, 65535, 29500, &d->master_port, msg, size);
	if (st)
		return st;
	const char *a = getenv("MASTER_ADDR");
	if (a && strlen(a) >= sizeof(d->master_addr))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "MASTER_ADDR: longer than %zu bytes",
				sizeof(d->master_addr) - 1);
	snprintf(d->master_addr, sizeof(d->master_addr), "%s", a && *a ? a : "127.0.0.1");
	return DG_OK;
}

struct dg_rdzv {
	dg_dist d;
	int listen_fd;
	int *peer; /* rank 0: the fd of rank i (peer[0] unused); others: peer[0] is rank 0's */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits until fd is ready for events (POLLIN | POLLOUT) or the deadline. */
static int wait_fd(int fd, short events, double deadline)
{
	for (;;) {
		double left = deadline - now_s();
		if (left <= 0)
			return 0;
		struct pollfd p = { .fd = fd, .events = events };
		int k = poll(&p, 1, (int)(left * 1000) + 1);
		if (k < 0 && errno == EINTR)
			continue;
		return k > 0;
	}
}

/* All n bytes to fd / from fd by the deadline; -1 on error or timeout,
 * 0 when the peer closed (recv), 1 done. */
static int send_all(int fd, const void *buf, size_t n, double deadline)
{
	const char *p = buf;
	while (n) {
		if (!wait_fd(fd, POLLOUT, deadline))
			return -1;
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0)
			return errno == EPIPE || errno == ECONNRESET ? 0 : -1;
		p += k;
		n -= (size_t)k;
	}
	return 1;
}

static int recv_all(int fd, void *buf, size_t n, double deadline)
{
	char *p = buf;
	while (n) {
		if (!wait_fd(fd, POLLIN, deadline))
			return -1;
		ssize_t k = recv(fd, p, n, 0);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			return 0;
		if (k < 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 1;
}

static dg_status gone(int rank, int rc, const char *what, char *msg, size_t size)
{
	return dg__msgf(DG_ERR_IO, msg, size, rc == 0 ? "rank %d is gone (it closed its connection) during %s"
						      : "rank %d did not answer during %s (timed out or failed)",
			rank, what);
}

static void nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static dg_status resolve(const dg_dist *d, struct sockaddr_storage *sa, socklen_t *len, char *msg, size_t size)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
	char port[16];
	snprintf(port, sizeof(port), "%d", d->master_port);
	int e = getaddrinfo(d->master_addr, port, &hints, &res);
	if (e || !res)
		return dg__msgf(DG_ERR_IO, msg, size, "MASTER_ADDR %s: %s", d->master_addr, gai_strerror(e));
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return DG_OK;
}

/* Rank 0: listen, then take world-1 connections, each saying its rank. */
static dg_status host(dg_rdzv *r, double deadline, char *msg, size_t size)
{
	const dg_dist *d = &r->d;
	struct sockaddr_storage sa;
	socklen_t len;
	dg_status st = resolve(d, &sa, &len, msg, size);
	if (st)
		return st;
	r->listen_fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	if (r->listen_fd < 0 || setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(r->listen_fd, (struct sockaddr *)&sa, len) || listen(r->listen_fd, d->world))
		return dg__msgf(DG_ERR_IO, msg, size, "rank 0: listen on %s:%d: %s", d->master_addr, d->master_port,
				strerror(errno));
	for (int joined = 1; joined < d->world;) {
		if (!wait_fd(r->listen_fd, POLLIN, deadline))
			return dg__msgf(DG_ERR_IO, msg, size,
					"rank 0: %d of %d ranks joined at %s:%d before the timeout", joined, d->world,
					d->master_addr, d->master_port);
		int fd = accept(r->listen_fd, NULL, NULL);
		if (fd < 0)
			continue;
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		nodelay(fd);
		int32_t k = -1;
		const double hello = now_s() + 5.0 < deadline ? now_s() + 5.0 : deadline; /* a stray client cannot stall us */
		if (recv_all(fd, &k, sizeof(k), hello) != 1 || k < 1 || k >= d->world || r->peer[k] >= 0) {
			close(fd); /* a stray connection, or a rank twice: not one of ours */
			continue;
		}
		r->peer[k] = fd;
		joined++;
	}
	return DG_OK;
}

/* Rank k > 0: connect to rank 0 (retrying until it listens), say k. */
static dg_status join(dg_rdzv *r, double deadline, char *msg, size_t size)
{
	const dg_dist *d = &r->d;
	struct sockaddr_storage sa;
	socklen_t len;
	dg_status st = resolve(d, &sa, &len, msg, size);
	if (st)
		return st;
	int err = 0;
	while (now_s() < deadline) {
		int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return dg__msgf(DG_ERR_IO, msg, size, "rank %d: socket: %s", d->rank, strerror(errno));
		if (connect(fd, (struct sockaddr *)&sa, len) == 0) {
			nodelay(fd);
			int32_t k = d->rank;
			if (send_all(fd, &k, sizeof(k), deadline) == 1) {
				r->peer[0] = fd;
				return DG_OK;
			}
		}
		err = errno;
		close(fd);
		usleep(50 * 1000);
	}
	return dg__msgf(DG_ERR_IO, msg, size, "rank %d: could not reach rank 0 at %s:%d before the timeout (%s)",
			d->rank, d->master_addr, d->master_port, strerror(err));
}

void dg_rdzv_close(dg_rdzv *r)
{
	if (!r)
		return;
	if (r->listen_fd >= 0)
		close(r->listen_fd);
	for (int i = 0; r->peer && i < r->d.world; i++)
		if (r->peer[i] >= 0)
			close(r->peer[i]);
	free(r->peer);
	free(r);
}

dg_status dg_rdzv_open(const dg_dist *d, double timeout_s, dg_rdzv **out, char *msg, size_t size)
{
	if (!d || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_rdzv_open: NULL argument");
	*out = NULL;
	if (d->world < 1 || d->rank < 0 || d->rank >= d->world)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "rank %d of world %d: ranks are 0..world-1", d->rank,
				d->world);
	dg_rdzv *r = calloc(1, sizeof(*r));
	if (!r || !(r->peer = malloc(sizeof(int) * (size_t)d->world))) {
		free(r);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	}
	r->d = *d;
	r->listen_fd = -1;
	for (int i = 0; i < d->world; i++)
		r->peer[i] = -1;
	const double deadline = now_s() + timeout_s;
	dg_status st = d->world == 1 ? DG_OK : d->rank == 0 ? host(r, deadline, msg, size) : join(r, deadline, msg, size);
	if (st) {
		dg_rdzv_close(r);
		return st;
	}
	*out = r;
	return DG_OK;
}

dg_status dg_rdzv_bcast(dg_rdzv *r, void *buf, size_t n, char *msg, size_t size)
{
	if (!r || (n && !buf))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_rdzv_bcast: NULL argument");
	const double deadline = now_s() + EXCHANGE_S;
	if (r->d.rank == 0) {
		for (int k = 1; k < r->d.world; k++) {
			int rc = send_all(r->peer[k], buf, n, deadline);
			if (rc != 1)
				return gone(k, rc, "a broadcast", msg, size);
		}
		return DG_OK;
	}
	int rc = r->d.world > 1 ? recv_all(r->peer[0], buf, n, deadline) : 1;
	return rc == 1 ? DG_OK : gone(0, rc, "a broadcast", msg, size);
}

dg_status dg_rdzv_same(dg_rdzv *r, const void *mine, size_t n, const char *what, char *msg, size_t size)
{
	if (!r || (n && !mine))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_rdzv_same: NULL argument");
	if (r->d.world == 1)
		return DG_OK;
	const double deadline = now_s() + EXCHANGE_S;
	int32_t first = -1; /* the first rank that differs, -1 none */
	if (r->d.rank == 0) {
		uint8_t *got = malloc(n ? n : 1);
		if (!got)
			return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
		for (int k = 1; k < r->d.world; k++) {
			int rc = recv_all(r->peer[k], got, n, deadline);
			if (rc != 1) {
				free(got);
				return gone(k, rc, "a check of the ranks' state", msg, size);
			}
			if (first < 0 && memcmp(got, mine, n) != 0)
				first = k;
		}
		free(got);
	} else {
		int rc = send_all(r->peer[0], mine, n, deadline);
		if (rc != 1)
			return gone(0, rc, "a check of the ranks' state", msg, size);
	}
	dg_status st = dg_rdzv_bcast(r, &first, sizeof(first), msg, size);
	if (st)
		return st;
	if (first >= 0)
		return dg__msgf(DG_ERR_CORRUPT, msg, size, "rank %d's %s differs from rank 0's: the ranks diverged",
				(int)first, what ? what : "state");
	return DG_OK;
}

dg_status dg_rdzv_barrier(dg_rdzv *r, char *msg, size_t size)
{
	const uint8_t one = 1;
	return dg_rdzv_same(r, &one, 1, "barrier", msg, size);
}

dg_status dg_rdzv_any(dg_rdzv *r, int flag, int *any, char *msg, size_t size)
{
	if (!r || !any)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_rdzv_any: NULL argument");
	uint8_t f = flag != 0;
	if (r->d.world > 1) {
		const double deadline = now_s() + EXCHANGE_S;
		if (r->d.rank == 0) {
			for (int k = 1; k < r->d.world; k++) {
				uint8_t g = 0;
				int rc = recv_all(r->peer[k], &g, 1, deadline);
				if (rc != 1)
					return gone(k, rc, "the ranks' agreement to go on", msg, size);
				f |= g;
			}
		} else {
			int rc = send_all(r->peer[0], &f, 1, deadline);
			if (rc != 1)
				return gone(0, rc, "the ranks' agreement to go on", msg, size);
		}
		dg_status st = dg_rdzv_bcast(r, &f, 1, msg, size);
		if (st)
			return st;
	}
	*any = f;
	return DG_OK;
}

dg_status dg_rdzv_mean(dg_rdzv *r, float *const *v, const size_t *n, int count, double *scalar, char *msg,
		       size_t size)
{
	if (!r || (count && (!v || !n)))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_rdzv_mean: NULL argument");
	if (r->d.world == 1)
		return DG_OK;
	const double deadline = now_s() + EXCHANGE_S;
	const int world = r->d.world;
	if (r->d.rank) { /* send ours, take rank 0's result */
		for (int i = 0; i < count; i++) {
			int rc = send_all(r->peer[0], v[i], n[i] * sizeof(float), deadline);
			if (rc != 1)
				return gone(0, rc, "the gradients' mean", msg, size);
		}
		if (scalar) {
			int rc = send_all(r->peer[0], scalar, sizeof(*scalar), deadline);
			if (rc != 1)
				return gone(0, rc, "the gradients' mean", msg, size);
		}
		for (int i = 0; i < count; i++) {
			dg_status st = dg_rdzv_bcast(r, v[i], n[i] * sizeof(float), msg, size);
			if (st)
				return st;
		}
		return scalar ? dg_rdzv_bcast(r, scalar, sizeof(*scalar), msg, size) : DG_OK;
	}
	size_t most = 0;
	for (int i = 0; i < count; i++)
		most = n[i] > most ? n[i] : most;
	double *acc = malloc(most * sizeof(double) + 8);
	float *got = malloc(most * sizeof(float) + 4);
	dg_status st = acc && got ? DG_OK : dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	/* tensor by tensor: rank 0's values, then each rank's in rank order */
	for (int i = 0; i < count && !st; i++) {
		for (size_t j = 0; j < n[i]; j++)
			acc[j] = v[i][j];
		for (int k = 1; k < world && !st; k++) {
			int rc = recv_all(r->peer[k], got, n[i] * sizeof(float), deadline);
			if (rc != 1) {
				st = gone(k, rc, "the gradients' mean", msg, size);
				break;
			}
			for (size_t j = 0; j < n[i]; j++)
				acc[j] += got[j];
		}
		for (size_t j = 0; j < n[i] && !st; j++)
			v[i][j] = (float)(acc[j] / world);
	}
	if (!st && scalar) {
		double sum = *scalar, g;
		for (int k = 1; k < world && !st; k++) {
			int rc = recv_all(r->peer[k], &g, sizeof(g), deadline);
			if (rc != 1)
				st = gone(k, rc, "the gradients' mean", msg, size);
			sum += g;
		}
		*scalar = sum / world;
	}
	free(acc);
	free(got);
	for (int i = 0; i < count && !st; i++)
		st = dg_rdzv_bcast(r, v[i], n[i] * sizeof(float), msg, size);
	if (!st && scalar)
		st = dg_rdzv_bcast(r, scalar, sizeof(*scalar), msg, size);
	return st;
}
