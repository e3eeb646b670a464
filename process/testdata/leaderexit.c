// A process whose main thread has exited (pthread_exit) while another
// runs on: the thread group leader stays listed in /proc/PID/task, a
// zombie, which ptrace refuses (EPERM) until the process ends.
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static void *run(void *arg) {
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

int main(void) {
	pthread_t t;
	pthread_create(&t, NULL, run, NULL);
	printf("ready\n");
	fflush(stdout);
	pthread_exit(NULL);
}
