#include <stdio.h>
#include <stdlib.h>
#include "util.h"

static int __attribute__((noinline)) classify(int x)
{
	switch (x % 7) {
	case 0:
		return clamp(x, 0, 10);
	case 1:
	case 2:
		return x * 3;
	case 3:
		return -x;
	default:
		break;
	}
	if (x > 100)
		return x / 5;
	return x + 1;
}

int __attribute__((noinline)) walk(const char *s)
{
	int n = 0;

	while (*s) {
		if (*s == '/')
			n++;
		else if (*s == '.')
			n += classify(n);
		s++;
	}
	return n;
}

int main(int argc, char **argv)
{
	int t[8];

	for (int i = 0; i < 8; i++)
		t[i] = classify(argc + i);
	if (argc > 1)
		printf("%d\n", walk(argv[1]));
	printf("%d\n", table_sum(t, 8));
	return 0;
}
