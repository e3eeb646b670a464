/* Loads libm with dlopen when told ("load"), then calls its cbrt() on
 * each "go": a library that is not mapped when kinst attaches. After the
 * load it naps 300 ms, time for kinst to see the library (it looks every
 * 50 ms). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
	char line[64];
	double (*cbrtp)(double) = NULL;
	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "load", 4) == 0) {
			void *h = dlopen("libm.so.6", RTLD_NOW);
			cbrtp = h ? (double (*)(double))dlsym(h, "cbrt") : NULL;
			usleep(300000);
			printf("loaded %d\n", cbrtp != NULL);
		} else if (cbrtp) {
			double s = 0;
			for (int i = 0; i < 1000; i++)
				s += cbrtp(i * 0.5);
			printf("calls 1000 sum %.3f\n", s);
		} else {
			printf("calls 0\n");
		}
		fflush(stdout);
	}
	return 0;
}
