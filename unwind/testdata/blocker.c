/* A program that blocks in read(2) at the bottom of a known call chain:
 * main → level1 → level2 → level3 → read. The live unwind test builds it
 * with and without frame pointers and names these functions from a stack
 * it reads while the program is blocked. */
#include <stdio.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline, noclone)) int level3(int fd)
{
	char buf[64];
	int n = read(fd, buf, sizeof buf);
	sink += n;
	return n + 3;
}

__attribute__((noinline, noclone)) int level2(int fd)
{
	int r = level3(fd);
	sink += r;
	return r * 2;
}

__attribute__((noinline, noclone)) int level1(int fd)
{
	int r = level2(fd);
	sink += r;
	return r + 1;
}

int main(void)
{
	printf("ready\n");
	fflush(stdout);
	return level1(0) & 0;
}
