/* A workload for punned jumps: shorts() is instructions of every length
 * too short for a jmp rel32 (1 to 4 bytes), back to back, in assembly so
 * that the lengths are what the test says. On each "go" line, THREADS
 * threads call it CALLS times each, check every result, and the program
 * prints the calls and their sum. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define THREADS 4
#define CALLS 500000

long shorts(long x);
__asm__(
	".text\n"
	".globl shorts\n"
	".type shorts, @function\n"
	"shorts:\n"
	"	push %rbx\n"           /* 1 byte: 53 */
	"	mov %rdi, %rax\n"      /* 3: 48 89 f8 */
	"	mov %edi, %ecx\n"      /* 2: 89 f9 */
	"	add %rcx, %rax\n"      /* 3: 48 01 c8 */
	"	sar $2, %rax\n"        /* 4: 48 c1 f8 02 */
	"	xor %ebx, %ebx\n"      /* 2: 31 db */
	"	lea 1(%rax), %rax\n"   /* 4: 48 8d 40 01 */
	"	pop %rbx\n"            /* 1: 5b */
	"	ret\n"                 /* 1: c3 */
	".size shorts, .-shorts\n"
	/* Padding, never run: the last two instructions' jmps read it,
	 * and its bytes send them far from the brk heap's room. */
	"	.byte 0xcc, 0xcc, 0xcc, 0xcc\n");

static long expect(long x)
{
	return ((x + (long)(unsigned int)x) >> 2) + 1;
}

static long sums[THREADS];

static void *run(void *arg)
{
	long id = (long)arg, s = 0;
	for (long i = 0; i < CALLS; i++) {
		long x = i * THREADS + id;
		long r = shorts(x);
		if (r != expect(x))
			__builtin_trap();
		s += r;
	}
	sums[id] = s;
	return NULL;
}

int main(void)
{
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		pthread_t th[THREADS];
		for (long i = 0; i < THREADS; i++)
			pthread_create(&th[i], NULL, run, (void *)i);
		long sum = 0;
		for (long i = 0; i < THREADS; i++) {
			pthread_join(th[i], NULL);
			sum += sums[i];
		}
		printf("calls %d sum %ld\n", THREADS * CALLS, sum);
	}
	return 0;
}
