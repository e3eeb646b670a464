// strlen is an indirect function of libc: the program prints the
// address its calls go to (the implementation the loader picked), then,
// told "call N" on stdin, calls it N times.
#include <stdio.h>
#include <string.h>

static size_t (*volatile length)(const char *) = strlen;

int main(void) {
	setvbuf(stdout, NULL, _IONBF, 0);
	printf("%p\n", (void *)length);
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		long n = 0, sum = 0;
		for (const char *c = line + 5; *c >= '0' && *c <= '9'; c++)
			n = 10 * n + (*c - '0');
		for (long i = 0; i < n; i++)
			sum += length("seven..");
		printf("done %ld\n", sum);
	}
	return 0;
}
