/* A program that blocks in read(2) inside a signal handler: main →
 * waiter → pause, interrupted by SIGUSR1 → handler → in_handler → read.
 * The unwind test reads its stack through glibc's signal trampoline. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline, noclone)) void in_handler(void)
{
	char c;
	sink += read(0, &c, 1);
}

__attribute__((noinline, noclone)) void handler(int sig)
{
	in_handler();
	sink += sig;
}

__attribute__((noinline, noclone)) int waiter(void)
{
	pause();
	return sink + 1;
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sigaction(SIGUSR1, &sa, NULL);
	printf("ready\n");
	fflush(stdout);
	return waiter() & 0;
}
