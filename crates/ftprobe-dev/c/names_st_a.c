/* A static `helper` (see names_ov.cc); names_st_b.c has another. */

__attribute__((noinline)) static int helper(int x)
{
    asm volatile("");
    return x + 10;
}

int st_a(int x)
{
    return helper(x);
}
