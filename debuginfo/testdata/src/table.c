#include "util.h"

int __attribute__((noinline)) table_sum(const int *t, int n)
{
	int sum = 0;

	for (int i = 0; i < n; i++)
		sum += clamp(t[i], -50, 50);
	return sum;
}
