/* A block only a covering run from the block before reaches: in
 * runinto(), "jmp 3f" is a 2-byte block entered only when the jne before
 * it is not taken (x == 0). No springboard slot is in its reach (130
 * bytes of code on either side, no padding), and the zeros after it make
 * every punned jmp over it land in the program's own text: without the
 * run from the block before, its probe would need a trap. runinto2() is
 * the same behind a 6-byte jne, the block before's own probe: the run
 * starts there, so that probe makes way for it. */
#include <stdio.h>
#include <stdlib.h>

long runinto(long x);
__asm__(
	".text\n"
	".globl runinto\n"
	".type runinto, @function\n"
	"runinto:\n"
	"	xor %eax, %eax\n"
	"	.rept 34\n"
	"	lea 1(%rax), %rax\n"   /* 4 bytes each: no slot within rel8 */
	"	.endr\n"
	"	mov $1, %ecx\n"        /* 5 bytes: the block's own probe */
	"	test %rdi, %rdi\n"     /* 3 */
	"	jne 2f\n"              /* 2 */
	"	jmp 3f\n"              /* 2: the block */
	"	.byte 0, 0, 0, 0\n"    /* never run: what a pun over the jmp reads */
	"3:	add $3, %rax\n"
	"	ret\n"
	"2:	add $2, %rax\n"
	"	.rept 34\n"
	"	lea 1(%rax), %rax\n"
	"	.endr\n"
	"	ret\n"
	".size runinto, .-runinto\n"
	".globl runinto2\n"
	".type runinto2, @function\n"
	"runinto2:\n"
	"	xor %eax, %eax\n"
	"	.rept 34\n"
	"	lea 1(%rax), %rax\n"
	"	.endr\n"
	"	test %rdi, %rdi\n"
	"	.byte 0x0f, 0x85\n"      /* jne 2f, rel32: 6 bytes */
	"	.long 2f - . - 4\n"
	"	jmp 3f\n"
	"	.byte 0, 0, 0, 0\n"
	"3:	add $3, %rax\n"
	"	ret\n"
	"2:	add $2, %rax\n"
	"	.rept 34\n"
	"	lea 1(%rax), %rax\n"
	"	.endr\n"
	"	ret\n"
	".size runinto2, .-runinto2\n");

long runinto2(long x);

int main(int argc, char **argv)
{
	long x = argc > 1 ? atol(argv[1]) : 0;
	printf("%ld %ld\n", runinto(x), runinto2(x));
	return 0;
}
