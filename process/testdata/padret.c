/* A workload for splices that run into padding: padret() has five
 * blocks too short for a jmp rel32 that end in a ret or jmp, each
 * followed by never-run nops (a 3-, 4-, 5-, 3- and 2-byte nop) before
 * the next label, in assembly so that the shapes are what the test says.
 * On each "go" line, THREADS threads call it CALLS times each, check
 * every result, and the program prints how many calls ran each of the
 * five blocks (tail0: "pop %rbx; ret"; tail1, tail2: a lone ret; tail3:
 * a lone jmp; tail4: a lone ret whose 2 bytes of nop leave a jmp 2
 * bytes short, for a punned jmp to own). */
#include <pthread.h>
#include <stdio.h>

#define THREADS 4
#define CALLS 200000

long padret(long x);
__asm__(
	".text\n"
	".globl padret\n"
	".type padret, @function\n"
	"padret:\n"
	"	mov %rdi, %rax\n"
	"	push %rbx\n"
	"	test $1, %dil\n"
	"	jne 1f\n"
	"	pop %rbx\n"                          /* tail0: 5b c3, then 3 bytes */
	"	ret\n"
	"	.byte 0x0f, 0x1f, 0x00\n"            /* nopl (%rax) */
	"1:	add $1, %rax\n"
	"	pop %rbx\n"
	"	test $2, %dil\n"
	"	jne 2f\n"
	"	ret\n"                               /* tail1: c3, then 4 bytes */
	"	.byte 0x0f, 0x1f, 0x40, 0x00\n"      /* nopl 0x0(%rax) */
	"2:	add $2, %rax\n"
	"	test $4, %dil\n"
	"	jne 3f\n"
	"	ret\n"                               /* tail2: c3, then 5 bytes: a slot's room */
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n" /* nopl 0x0(%rax,%rax,1) */
	"3:	add $4, %rax\n"
	"	test $8, %dil\n"
	"	jne 5f\n"
	"	jmp 4f\n"                            /* tail3: eb 04, then 3 bytes */
	"	.byte 0x0f, 0x1f, 0x00\n"
	"5:	add $8, %rax\n"
	"4:	add $16, %rax\n"
	"	test $16, %dil\n"
	"	jne 6f\n"
	"	ret\n"                               /* tail4: c3, then 2 bytes */
	"	.byte 0x66, 0x90\n"                  /* xchg %ax,%ax */
	"6:	add $32, %rax\n"
	"	ret\n"
	".size padret, .-padret\n");

/* expect is padret's result; ran[k] counts the calls that ran tail k. */
static long expect(long x, long *ran)
{
	if (!(x & 1)) {
		ran[0]++;
		return x;
	}
	if (!(x & 2)) {
		ran[1]++;
		return x + 1;
	}
	if (!(x & 4)) {
		ran[2]++;
		return x + 3;
	}
	if (!(x & 8))
		ran[3]++;
	long r = x + 7 + (x & 8) + 16;
	if (!(x & 16)) {
		ran[4]++;
		return r;
	}
	return r + 32;
}

static long tails[THREADS][5];

static void *run(void *arg)
{
	long id = (long)arg;
	for (int k = 0; k < 5; k++)
		tails[id][k] = 0;
	for (long i = 0; i < CALLS; i++) {
		long x = i * THREADS + id;
		if (padret(x) != expect(x, tails[id]))
			__builtin_trap();
	}
	return NULL;
}

int main(void)
{
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		pthread_t th[THREADS];
		long sum[5] = {0};
		for (long i = 0; i < THREADS; i++)
			pthread_create(&th[i], NULL, run, (void *)i);
		for (long i = 0; i < THREADS; i++) {
			pthread_join(th[i], NULL);
			for (int k = 0; k < 5; k++)
				sum[k] += tails[i][k];
		}
		printf("calls %d tail0 %ld tail1 %ld tail2 %ld tail3 %ld tail4 %ld\n", THREADS * CALLS,
		       sum[0], sum[1], sum[2], sum[3], sum[4]);
	}
	return 0;
}
