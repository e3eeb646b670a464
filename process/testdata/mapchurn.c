// Threads that map and unmap memory without a pause, for ARG seconds
// (default 20): a process whose /proc/PID/maps differs between any two
// reads, as kinst arms punned jumps in it.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static void *churn(void *arg) {
	(void)arg;
	for (unsigned i = 0;; i++) {
		size_t n = 4096 * (1 + i % 64);
		void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED) {
			*(volatile char *)p = 1;
			munmap(p, n);
		}
	}
	return NULL;
}

int main(int argc, char **argv) {
	int secs = argc > 1 ? atoi(argv[1]) : 20;
	pthread_t t;
	for (int i = 0; i < 3; i++)
		pthread_create(&t, NULL, churn, NULL);
	printf("ready\n");
	fflush(stdout);
	sleep(secs);
	return 0;
}
