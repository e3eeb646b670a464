/* A function that realigns its stack through a DRAP register (a
 * variable-length array next to a 64-byte-aligned one): gcc gives it a
 * CFA of [rbp-8] and saves rbp at rbp+0, both DWARF expressions. The
 * program blocks in read(2) below main → drap → leaf. */
#include <stdio.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline, noclone)) int leaf(int fd, char *p)
{
	int n = read(fd, p, 1);
	sink += n;
	return n + 1;
}

__attribute__((noinline, noclone)) int drap(int fd, int n)
{
	char vla[n];
	char big[64] __attribute__((aligned(64)));
	vla[0] = 1;
	big[0] = 3;
	int r = leaf(fd, big) + vla[n - 1] + big[0];
	sink += r;
	return r;
}

int main(void)
{
	printf("ready\n");
	fflush(stdout);
	return drap(0, 100 + sink) & 0;
}
