/* A program whose main thread blocks in a libc internal function:
 * pthread_join waits in __futex_abstimed_wait_common, a static function
 * of Debian's stripped libc.so.6 that only the symbols of its debug file
 * (libc6-dbg) name; the other thread blocks in read(2) on stdin. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static void *worker(void *arg)
{
	char b;
	(void)arg;
	return (void *)(long)read(0, &b, 1);
}

int main(void)
{
	pthread_t t;
	if (pthread_create(&t, 0, worker, 0) != 0)
		return 1;
	printf("ready\n");
	fflush(stdout);
	pthread_join(t, 0);
	return 0;
}
