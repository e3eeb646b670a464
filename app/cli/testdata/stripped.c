/* Exported functions with static ones between them: stripped to its
 * .dynsym (gcc -rdynamic, strip), the static functions have no symbol and
 * lie between exported ones, where only the symbols' sizes say they are
 * not the exported functions' code. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static int helper_a(int x) { return x % 7 ? x * 3 + 1 : x / 7; }
__attribute__((noinline)) int exported_one(int x) { return helper_a(x) + helper_a(x + 1); }
__attribute__((noinline)) static int helper_b(int x) { for (int i = 0; i < 3; i++) x ^= x << 1; return x; }
__attribute__((noinline)) int exported_two(int x) { return helper_b(x) - exported_one(x); }
__attribute__((noinline)) static long helper_c(long x) { return x > 1 ? helper_c(x / 2) + 1 : 0; }
__attribute__((noinline)) long exported_three(long x) { return helper_c(x) * 2 + exported_two((int)x); }

int main(int argc, char **argv) {
	long s = 0;
	for (int i = 0; i < 100000; i++)
		s += exported_three(i) + exported_one(i);
	printf("%ld\n", s);
	return 0;
}
