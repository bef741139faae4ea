/*
 * The option scanner (cli/common/scan.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/common/scan.h"

void dg__cli_scan_init(dg__cli_scan_state *s, int argc, char **argv, const char *cmd)
{
	s->argc = argc;
	s->argv = argv;
	s->i = 1;
	s->only_args = false;
	s->cmd = cmd;
}

static int scan_error(const dg__cli_scan_state *s, const char *fmt, const char *what)
{
	char m[512];
	snprintf(m, sizeof(m), fmt, what);
	dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s %s; see `%s %s --help`", s->cmd, m, dg__cli_name(),
		    s->cmd);
	return DG__CLI_SCAN_ERROR;
}

int dg__cli_scan(dg__cli_scan_state *s, const dg__cli_opt *opts, const char **arg)
{
	*arg = NULL;
	if (s->i >= s->argc)
		return DG__CLI_SCAN_END;
	const char *a = s->argv[s->i++];
	if (s->only_args || a[0] != '-' || a[1] == '\0') {
		*arg = a;
		return DG__CLI_SCAN_ARG;
	}
	if (strcmp(a, "--") == 0) {
		s->only_args = true;
		return dg__cli_scan(s, opts, arg);
	}
	const dg__cli_opt *o = NULL;
	const char *val = NULL;
	if (a[1] == '-') {
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t n = eq ? (size_t)(eq - name) : strlen(name);
		for (const dg__cli_opt *p = opts; p->id; p++)
			if (p->name && strlen(p->name) == n && strncmp(p->name, name, n) == 0)
				o = p;
		if (!o)
			return scan_error(s, "has no flag %s", a);
		if (eq) {
			if (!o->has_arg)
				return scan_error(s, "flag %s takes no value", a);
			val = eq + 1;
		}
	} else {
		for (const dg__cli_opt *p = opts; p->id; p++)
			if (p->short_name && p->short_name == a[1])
				o = p;
		if (!o || (!o->has_arg && a[2]))
			return scan_error(s, "has no flag %s", a);
		if (a[2])
			val = a + 2;
	}
	if (o->has_arg && !val) {
		if (s->i >= s->argc)
			return scan_error(s, "flag %s needs a value", a);
		val = s->argv[s->i++];
	}
	*arg = val;
	return o->id;
}

bool dg__cli_parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end = NULL;
	errno = 0;
	unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
	if (v[0] < '0' || v[0] > '9' || errno || *end || x < lo || x > hi) {
		dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s %s: expected a whole number from %llu to %llu",
			    flag, v, (unsigned long long)lo, (unsigned long long)hi);
		return false;
	}
	*out = x;
	return true;
}
