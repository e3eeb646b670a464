/* Calls ktlib.c's kt_nap() N times for each "nap N" line on stdin. */
#include <stdio.h>
#include <stdlib.h>

void kt_nap(void);

int main(void)
{
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		long n = strtol(line + 4, NULL, 10);
		for (long i = 0; i < n; i++)
			kt_nap();
		printf("napped %ld\n", n);
		fflush(stdout);
	}
	return 0;
}
