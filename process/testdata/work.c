/* A multi-threaded workload for the process engine's tests: on each
 * "go" line from stdin, THREADS threads call work() CALLS times each, and
 * the program prints how many calls it made and their checksum. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define CALLS 100000

__attribute__((noinline)) long work(long x)
{
	if (x & 1)
		return x * 3 + 1;
	return x / 2;
}

/* mix: straight-line code, instructions of every length (a splice of
 * each class fits in it); called as often as work(). */
__attribute__((noinline)) long mix(long x)
{
	long y = x * 0x12345;
	y ^= x >> 3;
	y += x << 7;
	y = y * 31 + 17;
	return y ^ (y >> 11);
}

/* dispatch: a switch dense enough that gcc -O2 jumps through a table
 * (for the web view's drawing of jump tables); never called. */
__attribute__((noinline)) long dispatch(long x, long y)
{
	switch (x) {
	case 0: return y + 11;
	case 1: return y * 13;
	case 2: return y - 17;
	case 3: return y ^ 19;
	case 4: return y << 3;
	case 5: return y >> 2;
	case 6: return y | 0x55;
	case 7: return y & 0x77;
	case 8: return ~y;
	case 9: return -y;
	}
	return 0;
}

/* nap sleeps 2 ms: a known wall time per call. */
__attribute__((noinline)) void nap(void)
{
	struct timespec ts = {0, 2000000};
	nanosleep(&ts, NULL);
}

static long sums[THREADS];
static volatile int spinning;
static long spun[THREADS];

/* spin: call work() until told to stop, checking each result. */
static void *spin(void *arg)
{
	long id = (long)arg, n = 0;
	while (spinning) {
		long x = n + id;
		long want = (x & 1) ? x * 3 + 1 : x / 2;
		if (work(x) != want)
			__builtin_trap();
		long y = x * 0x12345;
		y ^= x >> 3;
		y += x << 7;
		y = y * 31 + 17;
		if (mix(x) != (y ^ (y >> 11)))
			__builtin_trap();
		n++;
	}
	spun[id] = n;
	return NULL;
}

static void *run(void *arg)
{
	long id = (long)arg, s = 0;
	for (long i = 0; i < CALLS; i++)
		s += work(i + id) + mix(i);
	sums[id] = s;
	return NULL;
}

static void on_trap(int sig)
{
	(void)sig;
}

/* on_prof: a profiling signal's handler that takes a while, so that a
 * thread it interrupts inside one of kinst's patches stays out of it
 * for long enough for kinst to free the patch meanwhile. */
static void on_prof(int sig)
{
	(void)sig;
	for (volatile int i = 0; i < 20000; i++)
		;
}

int main(int argc, char **argv)
{
	char line[64];
	/* "sigtrap": handle SIGTRAP itself, as a runtime or a debugger's
	 * target may (kinst then refuses trap splices). */
	if (argc > 1 && strcmp(argv[1], "sigtrap") == 0)
		signal(SIGTRAP, on_trap);
	/* "prof": a SIGPROF every 100 us of CPU time. */
	if (argc > 1 && strcmp(argv[1], "prof") == 0) {
		struct itimerval it = {{0, 100}, {0, 100}};
		signal(SIGPROF, on_prof);
		setitimer(ITIMER_PROF, &it, NULL);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "spin", 4) == 0) {
			/* "spin": threads call work() until the next line. */
			pthread_t t[THREADS];
			spinning = 1;
			for (long i = 0; i < THREADS; i++)
				pthread_create(&t[i], NULL, spin, (void *)i);
			printf("spinning\n");
			if (!fgets(line, sizeof line, stdin))
				break;
			spinning = 0;
			long total = 0;
			for (int i = 0; i < THREADS; i++) {
				pthread_join(t[i], NULL);
				total += spun[i];
			}
			printf("spun %ld\n", total);
			continue;
		}
		if (strncmp(line, "fork ", 5) == 0) {
			/* "fork N": a child sleeps 300 ms, then calls work() N
			 * times checking each result (an alarm ends it if it
			 * hangs); the parent reports how it ended. */
			long n = strtol(line + 5, NULL, 10);
			pid_t pid = fork();
			if (pid == 0) {
				alarm(5);
				nanosleep(&(struct timespec){0, 300000000}, NULL);
				for (long i = 0; i < n; i++)
					if (work(i) != ((i & 1) ? i * 3 + 1 : i / 2))
						_exit(1);
				_exit(0);
			}
			int st;
			waitpid(pid, &st, 0);
			if (WIFEXITED(st))
				printf("child exit %d\n", WEXITSTATUS(st));
			else
				printf("child signal %d\n", WTERMSIG(st));
			continue;
		}
		if (strncmp(line, "nap ", 4) == 0) {
			long n = strtol(line + 4, NULL, 10);
			for (long i = 0; i < n; i++)
				nap();
			printf("napped %ld\n", n);
			continue;
		}
		if (strncmp(line, "go", 2) != 0)
			break;
		pthread_t t[THREADS];
		for (long i = 0; i < THREADS; i++)
			pthread_create(&t[i], NULL, run, (void *)i);
		long total = 0;
		for (int i = 0; i < THREADS; i++) {
			pthread_join(t[i], NULL);
			total += sums[i];
		}
		printf("calls %d checksum %ld\n", THREADS * CALLS, total);
	}
	return 0;
}
