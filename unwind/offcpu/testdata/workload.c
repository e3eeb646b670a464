// Off-CPU test workload: threads blocked in known system calls, built
// without frame pointers so user stacks need the CFI unwinder.
//
//   sleeper    blocked in clock_nanosleep all the time
//   halfsleep  blocked in clock_nanosleep half the time, spinning otherwise
//   piper      blocked in read() on a pipe
//   futexer    blocked in FUTEX_WAIT
//   waker      wakes piper and futexer every 250 ms, so that a tracer
//              sees their blocks end
//
// With an argument N it instead starts N threads blocked in pipe reads
// (the benchmark's helper). It prints "ready" once every thread has started, answers
// each line on stdin with "halfsleep ASLEEP IN_CALL ELAPSED" (seconds), and
// exits when stdin closes.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;
static int pipefd[2];
static int futex_word;

static NOINLINE void sleep_forever(void) {
	for (;;) {
		struct timespec ts = {1, 0};
		nanosleep(&ts, NULL);
		sink++;
	}
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static NOINLINE void spin_for(double s) {
	double end = now() + s;
	while (now() < end)
		sink++;
}

// halfsleep's own account of its time, the oracle for measured
// proportions: seconds asleep as requested (what a sampler sees as state
// S: the wait for a CPU after the timer fires is state R), seconds inside
// nanosleep (what a tracer measures from switch-out to switch-in), and
// seconds since it started.
static double half_asleep, half_in_call, half_start, half_t0;
static pthread_mutex_t half_mu = PTHREAD_MUTEX_INITIALIZER;

static NOINLINE void sleep_half(void) {
	half_start = now();
	for (;;) {
		struct timespec ts = {0, 20 * 1000 * 1000};
		pthread_mutex_lock(&half_mu);
		double t0 = half_t0 = now();
		pthread_mutex_unlock(&half_mu);
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&half_mu);
		double t1 = now();
		half_asleep += 0.020 < t1 - t0 ? 0.020 : t1 - t0;
		half_in_call += t1 - t0;
		half_t0 = 0;
		pthread_mutex_unlock(&half_mu);
		spin_for(0.020);
	}
}

static NOINLINE void read_pipe(void) {
	char c;
	for (;;) {
		if (read(pipefd[0], &c, 1) <= 0)
			sink++;
	}
}

static NOINLINE void wait_futex(void) {
	for (;;) {
		syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
		sink++;
	}
}

static NOINLINE void wake_others(void) {
	for (;;) {
		struct timespec ts = {0, 250 * 1000 * 1000};
		nanosleep(&ts, NULL);
		if (write(pipefd[1], "x", 1) != 1)
			sink++;
		syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}
}

static void *waker_main(void *a) { wake_others(); return a; }

static void *sleeper_main(void *a) { sleep_forever(); return a; }
static void *halfsleep_main(void *a) { sleep_half(); return a; }
static void *piper_main(void *a) { read_pipe(); return a; }
static void *futexer_main(void *a) { wait_futex(); return a; }

static void start(const char *name, void *(*fn)(void *)) {
	pthread_t t;
	if (pthread_create(&t, NULL, fn, NULL) != 0) {
		perror("pthread_create");
		exit(1);
	}
	pthread_setname_np(t, name);
}

int main(int argc, char **argv) {
	if (pipe(pipefd) != 0) {
		perror("pipe");
		return 1;
	}
	if (argc > 1) {
		int n = atoi(argv[1]);
		for (int i = 0; i < n; i++)
			start("blocked", piper_main);
	} else {
		start("sleeper", sleeper_main);
		start("halfsleep", halfsleep_main);
		start("piper", piper_main);
		start("futexer", futexer_main);
		start("waker", waker_main);
	}
	printf("ready\n");
	fflush(stdout);
	char buf[64];
	while (read(0, buf, sizeof buf) > 0) {
		// The sleep in progress counts up to now, so that two reports
		// bracket exactly the time between them.
		pthread_mutex_lock(&half_mu);
		double t = now(), asleep = half_asleep, in_call = half_in_call;
		if (half_t0) {
			in_call += t - half_t0;
			asleep += 0.020 < t - half_t0 ? 0.020 : t - half_t0;
		}
		printf("halfsleep %.6f %.6f %.6f\n", asleep, in_call, half_start ? t - half_start : 0);
		pthread_mutex_unlock(&half_mu);
		fflush(stdout);
	}
	return 0;
}
