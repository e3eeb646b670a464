// merged.c: at -O2 gcc folds line 10's else-if into line 11's code:
// line 10's only row covers no byte, at the address line 11's starts. gdb
// places a breakpoint on line 10 there; so does kinst in a process
// (TestMergedLinePoint): 501 of mix's 1,000 calls reach it.
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int mix(int a, int b) {
	int r = 0;
	if (a > b) r = a - b;
	else if (a == b) r = 0;
	else r = b * 3;
	for (int i = 0; i < (a & 7); i++) r += i;
	return r;
}
int main(int argc, char **argv) {
	long s = 0;
	for (int i = 0; i < 1000; i++) s += mix(i, 500);
	printf("%ld\n", s);
	return 0;
}
