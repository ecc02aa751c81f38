/* Memory and string functions.  The copies use rep movs/stos so gcc cannot turn their
 * loops back into calls to themselves. */
#include "lib.h"

void *memcpy(void *dst, const void *src, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(src), "+c"(n) : : "memory");
    return dst;
}

void *memmove(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d <= s || d >= s + n)
        return memcpy(dst, src, n);
    while (n--)
        d[n] = s[n];
    return dst;
}

void *memset(void *dst, int c, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

size_t strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

int strcmp(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

const char *err_name(int err)
{
    switch (err < 0 ? -err : err) {
    case E_OK: return "ok";
    case E_NOMEM: return "out_of_memory";
    case E_INVAL: return "invalid_argument";
    case E_NODEV: return "no_device";
    case E_BUSY: return "poll_timeout";
    case E_FAULT: return "channel_fault";
    case E_TIMEDOUT: return "wait_timeout";
    case E_REFUSED: return "hypercall_refused";
    default: return "error";
    }
}
