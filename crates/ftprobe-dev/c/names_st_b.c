/* A static `helper` (see names_ov.cc); names_st_a.c has another. */

__attribute__((noinline)) static int helper(int x)
{
    asm volatile("");
    return x + 20;
}

int st_b(int x)
{
    return helper(x);
}
