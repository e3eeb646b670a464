/* A threaded program for the LLD test: a worker thread blocks in read(2)
 * on stdin below worker → level2 → level3, and the main thread in
 * pthread_join. Linked with -fuse-ld=lld, its executable segment shares
 * a file page with the read-only one. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline, noclone)) int level3(void)
{
	char buf[64];
	int n = read(0, buf, sizeof buf);
	sink += n;
	return n + 3;
}

__attribute__((noinline, noclone)) int level2(void)
{
	int r = level3();
	sink += r;
	return r * 2;
}

__attribute__((noinline, noclone)) void *worker(void *arg)
{
	sink += level2();
	return arg;
}

int main(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, worker, NULL) != 0)
		return 1;
	printf("ready\n");
	fflush(stdout);
	pthread_join(t, NULL);
	return sink & 0;
}
