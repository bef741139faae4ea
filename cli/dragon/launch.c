/*
 * dragon train --gpus N: the launcher. It starts N ranks of the same
 * command, each this program again with torchrun's environment (RANK,
 * WORLD_SIZE, LOCAL_RANK = its GPU, MASTER_ADDR 127.0.0.1, MASTER_PORT a
 * free port unless set), and watches them:
 *   - the ranks run in a process group of their own, so a terminal's ^C
 *     reaches the launcher alone, which passes SIGINT or SIGTERM on to
 *     every rank once (each then stops at the same step with its
 *     checkpoint: the ranks agree on it);
 *   - once a rank fails (a non-zero exit, or a signal: kill -9) the others
 *     get SIGTERM and, 30 s later, SIGKILL (a rank blocked in a collective
 *     with a dead peer cannot stop by itself); the rank named is the
 *     cause: one killed by a signal this launcher did not send, else the
 *     first that failed (its peers fail after it, "rank K is gone");
 *     the checkpoints are written atomically, so the newest one is whole,
 *     and the message says which it is.
 * Exit status: 0 when every rank succeeded, 128 + the signal when
 * stopped by one, else 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "cli/common/cli.h"
#include "cli/common/progress.h"
#include "cli/dragon/cmd.h"
#include "dragon/checkpoint.h"

#define KILL_AFTER_S 30.0

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
	got_signal = sig;
}

/* A loopback port nobody listens on now (0 if none could be had). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return 0;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int port = 0;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void describe(int ws, char *buf, size_t size)
{
	if (WIFSIGNALED(ws))
		snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
	else
		snprintf(buf, size, "exited with status %d", WEXITSTATUS(ws));
}

int dg__cli_launch(int argc, char **argv, int n, const char *out_dir)
{
	char port[16];
	const char *mp = getenv("MASTER_PORT");
	int p = mp && *mp ? atoi(mp) : free_port();
	if (p <= 0 || p > 65535)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "--gpus %d: no free port for the ranks' rendezvous (set MASTER_PORT)",
				   n);
	snprintf(port, sizeof(port), "%d", p);
	char **cargv = calloc((size_t)argc + 2, sizeof(char *));
	pid_t *pid = calloc((size_t)n, sizeof(pid_t));
	if (!cargv || !pid) {
		free(cargv);
		free(pid);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	}
	static char prog[] = "dragon";
	cargv[0] = prog;
	for (int i = 0; i < argc; i++)
		cargv[i + 1] = argv[i];

	struct sigaction sa, old_int, old_term;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	got_signal = 0;
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	fflush(stdout);
	fflush(stderr);
	int alive = 0;
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		if (pid[r] < 0) {
			pid[r] = 0;
			dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "--gpus %d: fork of rank %d: %s", n, r, strerror(errno));
			break;
		}
		if (pid[r] == 0) {
			char rank[16], world[16];
			snprintf(rank, sizeof(rank), "%d", r);
			snprintf(world, sizeof(world), "%d", n);
			setpgid(0, 0);
			signal(SIGINT, SIG_DFL);
			signal(SIGTERM, SIG_DFL);
			setenv("RANK", rank, 1);
			setenv("LOCAL_RANK", rank, 1);
			setenv("WORLD_SIZE", world, 1);
			if (!getenv("MASTER_ADDR"))
				setenv("MASTER_ADDR", "127.0.0.1", 1);
			setenv("MASTER_PORT", port, 1);
			execv("/proc/self/exe", cargv);
			fprintf(stderr, "dragon: rank %d: exec /proc/self/exe: %s\n", r, strerror(errno));
			_exit(127);
		}
		alive++;
	}
	int forwarded = 0, first = -1, first_ws = 0, stopped_by = 0, cause = -1, cause_ws = 0;
	unsigned *sent = calloc((size_t)n, sizeof(unsigned)); /* the signals sent to each rank (bits) */
	if (!sent) {
		for (int r = 0; r < n; r++)
			if (pid[r] > 0)
				kill(pid[r], SIGKILL);
	}
	double kill_at = 0;
	if (alive < n) { /* a fork failed: stop the ones started */
		first = n;
		kill_at = dg__cli_now_s() + KILL_AFTER_S;
		for (int r = 0; r < n; r++)
			if (pid[r] > 0)
				kill(pid[r], SIGTERM);
	}
	while (alive > 0) {
		const int sig = got_signal;
		if (sig && sig != forwarded) { /* on to every rank, once a signal */
			forwarded = sig;
			stopped_by = sig;
			for (int r = 0; r < n; r++)
				if (pid[r] > 0)
					kill(pid[r], sig);
		}
		if (kill_at > 0 && dg__cli_now_s() > kill_at) {
			for (int r = 0; r < n; r++)
				if (pid[r] > 0) {
					kill(pid[r], SIGKILL);
					if (sent)
						sent[r] |= 1u << SIGKILL;
				}
			kill_at = 0;
		}
		int ws;
		pid_t w = waitpid(-1, &ws, WNOHANG);
		if (w <= 0) {
			usleep(20 * 1000);
			continue;
		}
		int r = 0;
		while (r < n && pid[r] != w)
			r++;
		if (r == n)
			continue;
		pid[r] = 0;
		alive--;
		const bool ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
		const bool by_stop = stopped_by && WIFEXITED(ws) && WEXITSTATUS(ws) == 128 + stopped_by;
		const bool by_us = WIFSIGNALED(ws) && sent && (sent[r] & (1u << WTERMSIG(ws)));
		if (!ok && !by_stop && !by_us && WIFSIGNALED(ws) && cause < 0) {
			cause = r; /* killed from outside: what the others died of */
			cause_ws = ws;
		}
		if (!ok && !by_stop && first < 0) {
			first = r;
			first_ws = ws;
			kill_at = dg__cli_now_s() + KILL_AFTER_S;
			for (int k = 0; k < n; k++)
				if (pid[k] > 0) {
					kill(pid[k], SIGTERM);
					if (sent)
						sent[k] |= 1u << SIGTERM;
				}
		}
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	free(cargv);
	free(pid);
	free(sent);
	if (cause >= 0) {
		first = cause;
		first_ws = cause_ws;
	}
	if (first >= 0 && first < n) {
		char how[128], ck[256] = "no checkpoint was written";
		describe(first_ws, how, sizeof(how));
		int64_t latest = -1;
		char why[512];
		if (dg_checkpoint_prune(out_dir, 0, &latest, why, sizeof(why)) == DG_OK && latest >= 0)
			snprintf(ck, sizeof(ck), "the newest checkpoint is step %" PRId64 " (resume with --resume)", latest);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "rank %d of %d %s; the other ranks were stopped; %s", first, n,
				   how, ck);
	}
	if (first == n)
		return DG__CLI_FAIL;
	return stopped_by ? 128 + stopped_by : DG__CLI_OK;
}
