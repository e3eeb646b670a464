// tiny.c: a function of two instructions (lea; ret) called with a
// millisecond between calls. No jmp fits its 1-byte ret, so a timer's
// exit moves onto the entry's instruction (TestTimeTinyFunction).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int tiny(int x) { return x * 3 + 1; }

int main(void) {
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		long s = 0;
		for (int i = 0; i < 100; i++) {
			s += tiny(i);
			usleep(1000);
		}
		printf("%ld\n", s);
	}
	return 0;
}
