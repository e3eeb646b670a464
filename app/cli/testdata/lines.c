#include <stdio.h>
__attribute__((noinline)) int work(int x)
{
	int y = x * 3;
	if (x % 2)
		y += 7;
	return y;
}

int main(void)
{
	long s = 0;
	for (int i = 0; i < 1000; i++)
		s += work(i);
	printf("%ld\n", s);
	return 0;
}
