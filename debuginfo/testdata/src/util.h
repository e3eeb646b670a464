/* An inline helper: its code lands in the functions that call it. */
#include <stdio.h>

static inline int clamp(int v, int lo, int hi)
{
	if (v < lo) {
		fprintf(stderr, "%d below %d\n", v, lo);
		return lo;
	}
	if (v > hi)
		return hi;
	return v;
}

int table_sum(const int *t, int n);
