/* Code for the objdump cross-check: branches, a jump table, calls,
 * RIP-relative data, SSE and string operations. */
#include <string.h>

volatile long sink;
static long table[64];

__attribute__((noinline)) long classify(int x)
{
	switch (x) {
	case 0: return 11;
	case 1: return table[3] + 7;
	case 2: return table[x] * 3;
	case 3: sink = x; return 5;
	case 4: return -1;
	case 5: return table[9] ^ x;
	default: return x * 2;
	}
}

__attribute__((noinline)) double mix(double a, float b, long c)
{
	return a * b + (double)c / 3.0;
}

__attribute__((noinline)) void copy(char *d, const char *s, unsigned long n)
{
	memcpy(d, s, n);
	for (unsigned long i = 0; i < n; i++)
		d[i] ^= (char)(i * 31);
}

int main(int argc, char **argv)
{
	char buf[64];
	copy(buf, argv[0], argc < 60 ? 8 : 16);
	return (int)classify(argc) + (int)mix(argc, 1.5f, sink) + buf[1];
}
