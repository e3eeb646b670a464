/* kinst bench hit --user's workload: "run N" calls hit() N times and
 * prints the loop's time in ns; hit() has instructions of every length
 * for the splice classes. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) long hit(long x)
{
	long y = x * 0x12345;
	y ^= x >> 3;
	return y + 1;
}

int main(void)
{
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		long n = strtol(line + 4, NULL, 10), s = 0;
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		for (long i = 0; i < n; i++)
			s += hit(i);
		clock_gettime(CLOCK_MONOTONIC, &b);
		printf("ns %ld sum %ld\n", (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec), s);
	}
	return 0;
}
