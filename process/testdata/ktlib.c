/* A shared library with DWARF for the process engine's tests of a
 * library's source lines: kt_nap() sleeps 1 ms. */
#include <time.h>

__attribute__((noinline)) void kt_nap(void)
{
	struct timespec ts = {0, 1000000};
	nanosleep(&ts, NULL); /* kt_nap's sleep */
}
