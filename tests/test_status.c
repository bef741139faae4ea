/* Status strings: every code has a distinct, non-empty name. */
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/status.h"

Test(status, every_code_has_a_distinct_name)
{
	for (int i = 0; i < DG_STATUS__COUNT; i++) {
		const char *a = dg_status_str((dg_status)i);
		cr_assert(a && a[0], "status %d has no name", i);
		for (int j = 0; j < i; j++)
			cr_assert_str_neq(a, dg_status_str((dg_status)j));
	}
	cr_assert_eq(DG_OK, 0);
	cr_assert_str_eq(dg_status_str(DG_ERR_INVALID_SPEC), "invalid spec");
}

Test(status, out_of_range_is_named_not_crashed)
{
	cr_assert_str_eq(dg_status_str((dg_status)-1), "unknown status");
	cr_assert_str_eq(dg_status_str(DG_STATUS__COUNT), "unknown status");
}
