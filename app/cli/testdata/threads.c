/* Starts threads in rounds (glibc runs parts of pthread_create and the
 * start of each thread with every signal blocked), then blocks every
 * signal itself and formats numbers: code a trap splice must not be in. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>

static volatile long sink;

static void *run(void *arg)
{
	for (int i = 0; i < 1000; i++)
		sink += i;
	return arg;
}

int main(void)
{
	for (int r = 0; r < 100; r++) {
		pthread_t t[4];
		for (int i = 0; i < 4; i++)
			pthread_create(&t[i], NULL, run, NULL);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
	}
	sigset_t all;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, NULL);
	long n = 0;
	for (int i = 0; i < 100; i++) {
		char b[32];
		n += snprintf(b, sizeof b, "%d", i);
	}
	printf("done %ld %d\n", n, sink > 0);
	return 0;
}
