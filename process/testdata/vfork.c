// A vfork child that runs libc code (strtol) in its parent's memory for
// 1.5 s before it exits, as posix_spawn's child runs libc until its
// exec; then the parent, told "call N" on stdin, calls strtol N times.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long (*volatile conv)(const char *, char **, int) = strtol;

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); // the vDSO: no system call
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void) {
	setvbuf(stdout, NULL, _IONBF, 0);
	pid_t pid = vfork();
	if (pid == 0) {
		static const char msg[] = "child running\n";
		write(1, msg, sizeof msg - 1);
		double end = now() + 1.5;
		long sum = 0;
		while (now() < end)
			sum += conv("12345", NULL, 10);
		_exit(sum == 0 ? 3 : 0);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 2;
	printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		long n = 0, sum = 0;
		for (const char *c = line + 5; *c >= '0' && *c <= '9'; c++)
			n = 10 * n + (*c - '0'); // not strtol: its calls are the ones counted
		for (long i = 0; i < n; i++)
			sum += conv("7", NULL, 10);
		printf("done %ld\n", sum);
	}
	return 0;
}
