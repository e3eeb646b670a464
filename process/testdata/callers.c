// callers.c: callers that keep values in registers across a call to a
// function they know leaves those registers alone, as GCC at -O2
// compiles a static function's callers (-fipa-ra). A timer at the
// callee's entry and exits must not touch them (TestTimeKeepsCallersRegisters).
//
// Each line "N" on stdin runs one round and prints
// "<registers changed> <fib(N)> <sum 1..10N>".
#include <stdio.h>
#include <stdlib.h>

// leaf touches no register: the asm caller below keeps eight
// caller-saved ones across calls to it, which only -fipa-ra's knowledge
// of leaf allows.
__attribute__((noinline, used)) void leaf(void) { __asm__ volatile("nop; nop; nop; nop; nop"); }

__attribute__((noinline)) long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

// tail is a loop once optimised, fib a recursion: gcc 12 -O2 has
// fibRound keep n in %edx and bad in %r8d across the call to tail, and
// tail's sum in %ecx across the call to fib.
__attribute__((noinline)) int tail(int n, int acc) { return n == 0 ? acc : tail(n - 1, acc + n); }

__attribute__((noinline)) void fibRound(int n, int bad) { printf("%d %ld %d\n", bad, fib(n), tail(n * 10, 0)); }

static int leafRound(void) {
	unsigned long r[9];
	int bad = 0;
	for (int it = 0; it < 1000; it++) {
		__asm__ volatile(
			"mov $0x11,%%rcx\n mov $0x22,%%rdx\n mov $0x33,%%rsi\n mov $0x44,%%rdi\n"
			"mov $0x55,%%r8\n mov $0x66,%%r9\n mov $0x77,%%r10\n mov $0x88,%%r11\n mov $0x99,%%rax\n"
			"call leaf\n"
			"mov %%rcx,0(%0)\n mov %%rdx,8(%0)\n mov %%rsi,16(%0)\n mov %%rdi,24(%0)\n"
			"mov %%r8,32(%0)\n mov %%r9,40(%0)\n mov %%r10,48(%0)\n mov %%r11,56(%0)\n mov %%rax,64(%0)\n"
			:
			: "r"(r)
			: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory", "cc");
		for (int i = 0; i < 9; i++)
			if (r[i] != 0x11ul * (i + 1))
				bad++;
	}
	return bad;
}

int main(void) {
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		int n = atoi(line);
		fibRound(n, leafRound());
	}
	return 0;
}
