/*
 * dragon/dist.h and dragon/comm.h without a GPU:
 *   - the rank's place from the environment (torchrun's names), defaults
 *     and refusals naming the variable;
 *   - the TCP rendezvous of 3 processes started in any order: rank 0's
 *     bytes broadcast, a state check that passes, one that names the rank
 *     that differs on every rank, a barrier; a rank that dies is named by
 *     the others; a rank 0 that never comes is a timeout naming the
 *     address; a world of one needs no network;
 *   - the NCCL door: the library found (the toolkit ships it) and its
 *     version, two unique ids without a GPU; DRAGON_NCCL pointing nowhere
 *     is one line saying where it looked;
 *   - on a GPU: a communicator of one rank all-reduces f32 and bf16 in
 *     place on the stream (sum and average of one rank: the values).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "dragon/comm.h"
#include "dragon/dist.h"
#include "gpu_helpers.h"

static void clear_env(void)
{
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("LOCAL_RANK");
	unsetenv("MASTER_ADDR");
	unsetenv("MASTER_PORT");
}

Test(dist, env)
{
	char msg[512];
	dg_dist d;
	clear_env();
	cr_assert_eq(dg_dist_from_env(&d, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(d.rank == 0 && d.world == 1 && d.local_rank == 0 && d.master_port == 29500);
	cr_assert_str_eq(d.master_addr, "127.0.0.1");
	setenv("WORLD_SIZE", "4", 1);
	setenv("RANK", "3", 1);
	setenv("LOCAL_RANK", "1", 1);
	setenv("MASTER_ADDR", "node7", 1);
	setenv("MASTER_PORT", "1234", 1);
	cr_assert_eq(dg_dist_from_env(&d, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(d.rank == 3 && d.world == 4 && d.local_rank == 1 && d.master_port == 1234);
	cr_assert_str_eq(d.master_addr, "node7");
	setenv("RANK", "4", 1);
	cr_assert_eq(dg_dist_from_env(&d, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "RANK=4") && strstr(msg, "0 to 3"), "%s", msg);
	setenv("RANK", "1", 1);
	setenv("MASTER_PORT", "http", 1);
	cr_assert_eq(dg_dist_from_env(&d, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "MASTER_PORT=http"), "%s", msg);
	clear_env();
}

/* A port nobody listens on now. */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	socklen_t len = sizeof(a);
	getsockname(fd, (struct sockaddr *)&a, &len);
	close(fd);
	return ntohs(a.sin_port);
}

static dg_dist world(int rank, int n, int port)
{
	dg_dist d = { .rank = rank, .world = n, .local_rank = rank, .master_port = port };
	strcpy(d.master_addr, "127.0.0.1");
	return d;
}

/* What rank `rank` of 3 does, in a child; its exit code says how far it got
 * (0 all well). mode 0: bcast, same, a differing check (rank 2 differs),
 * barrier; mode 1: rank 1 exits after the bcast, the others check. */
static int child(int rank, int port, int mode)
{
	char msg[512];
	dg_rdzv *r;
	dg_dist d = world(rank, 3, port);
	if (dg_rdzv_open(&d, 20.0, &r, msg, sizeof(msg)))
		return 10;
	unsigned char id[128];
	for (int i = 0; i < 128; i++)
		id[i] = rank == 0 ? (unsigned char)(i * 7 + 1) : 0;
	if (dg_rdzv_bcast(r, id, sizeof(id), msg, sizeof(msg)))
		return 11;
	for (int i = 0; i < 128; i++)
		if (id[i] != (unsigned char)(i * 7 + 1))
			return 12;
	if (mode == 1 && rank == 1)
		_exit(0); /* gone, its socket closed by the kernel */
	char digest[32];
	memset(digest, 5, sizeof(digest));
	dg_status st = dg_rdzv_same(r, digest, sizeof(digest), "the weights' digest", msg, sizeof(msg));
	if (mode == 1)
		return st == DG_ERR_IO && strstr(msg, "rank ") && strstr(msg, "gone") ? 0 : 13;
	if (st)
		return 14;
	digest[3] = rank == 2 ? 9 : 5;
	st = dg_rdzv_same(r, digest, sizeof(digest), "the weights' digest", msg, sizeof(msg));
	if (st != DG_ERR_CORRUPT || !strstr(msg, "rank 2's the weights' digest differs"))
		return 15;
	if (dg_rdzv_barrier(r, msg, sizeof(msg)))
		return 16;
	dg_rdzv_close(r);
	return 0;
}

static void three(int mode, const int order[3])
{
	int port = free_port();
	pid_t pid[3];
	for (int i = 0; i < 3; i++) {
		int rank = order[i];
		pid[rank] = fork();
		cr_assert_geq(pid[rank], 0);
		if (pid[rank] == 0)
			_exit(child(rank, port, mode));
		usleep(20000);
	}
	for (int k = 0; k < 3; k++) {
		int ws;
		cr_assert_eq(waitpid(pid[k], &ws, 0), pid[k]);
		cr_assert(WIFEXITED(ws), "rank %d died of signal %d", k, WTERMSIG(ws));
		cr_assert_eq(WEXITSTATUS(ws), 0, "mode %d: rank %d stopped at step %d", mode, k, WEXITSTATUS(ws));
	}
}

Test(dist, rendezvous_of_three_in_any_order)
{
	three(0, (int[3]){ 0, 1, 2 });
	three(0, (int[3]){ 2, 1, 0 }); /* rank 0 last: the others retry until it listens */
}

Test(dist, a_rank_that_dies_is_named)
{
	three(1, (int[3]){ 1, 0, 2 });
}

Test(dist, a_missing_rank_0_is_a_timeout_and_a_world_of_one_needs_nothing)
{
	char msg[512];
	dg_rdzv *r = (dg_rdzv *)1;
	dg_dist d = world(1, 2, free_port());
	cr_assert_eq(dg_rdzv_open(&d, 0.3, &r, msg, sizeof(msg)), DG_ERR_IO);
	cr_assert(strstr(msg, "could not reach rank 0 at 127.0.0.1:"), "%s", msg);
	cr_assert_null(r);
	d = world(0, 2, free_port());
	cr_assert_eq(dg_rdzv_open(&d, 0.3, &r, msg, sizeof(msg)), DG_ERR_IO);
	cr_assert(strstr(msg, "1 of 2 ranks joined"), "%s", msg);
	d = world(0, 1, 1);
	cr_assert_eq(dg_rdzv_open(&d, 0.0, &r, msg, sizeof(msg)), DG_OK, "%s", msg);
	char b[4] = "abc";
	cr_assert_eq(dg_rdzv_bcast(r, b, 4, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_rdzv_same(r, b, 4, "x", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_rdzv_barrier(r, msg, sizeof(msg)), DG_OK);
	dg_rdzv_close(r);
	d = world(2, 2, 1);
	cr_assert_eq(dg_rdzv_open(&d, 0.0, &r, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
}

Test(comm, the_nccl_door)
{
	char msg[1024], path[512];
	int v = 0;
	dg_status st = dg_nccl_version(&v, path, sizeof(path), msg, sizeof(msg));
	if (st) { /* a toolkit without NCCL: the door says so, once */
		cr_assert_eq(st, DG_ERR_UNSUPPORTED);
		cr_assert(strstr(msg, "NCCL not found"), "%s", msg);
		printf("comm: no NCCL here: %s\n", msg);
		return;
	}
	cr_assert_geq(v, 21000, "%d", v);
	printf("comm: NCCL %d from %s\n", v, path);
	uint8_t a[DG_COMM_ID_BYTES], b[DG_COMM_ID_BYTES];
	cr_assert_eq(dg_comm_unique_id(a, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_comm_unique_id(b, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_neq(memcmp(a, b, sizeof(a)), 0, "two ids the same");
}

/* DRAGON_NCCL naming nothing (each test is a process of its own, whose
 * door opens at its first call): one line saying where it looked. */
Test(comm, a_missing_nccl_is_one_line)
{
	setenv("DRAGON_NCCL", "/nonexistent/libnccl.so.2", 1);
	char msg[1024];
	int v;
	cr_assert_eq(dg_nccl_version(&v, NULL, 0, msg, sizeof(msg)), DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "NCCL not found (looked for /nonexistent/libnccl.so.2"), "%s", msg);
	uint8_t id[DG_COMM_ID_BYTES];
	cr_assert_eq(dg_comm_unique_id(id, msg, sizeof(msg)), DG_ERR_UNSUPPORTED);
}

Test(comm, gpu_allreduce_of_one_rank)
{
	dg_device *dev = gh_open();
	char msg[1024];
	uint8_t id[DG_COMM_ID_BYTES];
	cr_assert_eq(dg_comm_unique_id(id, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_comm *c;
	cr_assert_eq(dg_comm_create(dev, id, 1, 0, &c), DG_OK, "%s", dg_device_errmsg(dev));
	float h[1000], back[1000];
	for (int i = 0; i < 1000; i++)
		h[i] = (float)i * 0.5f - 7.0f;
	dg_dptr p = gh_upload(dev, h, sizeof(h));
	cr_assert_eq(dg_comm_allreduce(c, p, 1000, DG_FMT_F32, 0), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_comm_allreduce(c, p, 1000, DG_FMT_F32, 1), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, back, p, sizeof(back));
	gh_expect_bytes("f32 all-reduce of one rank", back, h, sizeof(h));
	uint16_t hb[1000], bb[1000];
	for (int i = 0; i < 1000; i++)
		hb[i] = (uint16_t)(0x3f80 + i % 64);
	dg_dptr q = gh_upload(dev, hb, sizeof(hb));
	cr_assert_eq(dg_comm_allreduce(c, q, 1000, DG_FMT_BF16, 0), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, bb, q, sizeof(bb));
	gh_expect_bytes("bf16 all-reduce of one rank", bb, hb, sizeof(hb));
	cr_assert_eq(dg_comm_allreduce(c, q, 1000, DG_FMT_INT8, 0), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_comm_check(c), DG_OK, "%s", dg_device_errmsg(dev));
	dg_comm_destroy(c, 0);
	cr_assert_eq(dg_comm_create(dev, id, 2, 2, &c), DG_ERR_INVALID_ARG);
	gh_close(dev);
}
