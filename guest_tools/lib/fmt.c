/* A small printf for result records and console lines. */
#include "lib.h"

struct out {
    char *buf;
    size_t size, len;
};

static void put(struct out *o, char c)
{
    if (o->len + 1 < o->size)
        o->buf[o->len] = c;
    o->len++;
}

static void put_str(struct out *o, const char *s, int width, char pad)
{
    int n = (int)strlen(s);
    for (; width > n; width--)
        put(o, pad);
    while (*s)
        put(o, *s++);
}

static void put_uint(struct out *o, uint64_t v, unsigned base, int upper, int width, char pad,
                     int negative)
{
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = digits[v % base];
        v /= base;
    } while (v);
    if (negative && pad == '0') {
        put(o, '-');
        width--;
    } else if (negative) {
        tmp[n++] = '-';
    }
    for (; width > n; width--)
        put(o, pad);
    while (n)
        put(o, tmp[--n]);
}

/* d.ddde[+-]XX; enough for error magnitudes in result records. */
static void put_exp(struct out *o, double v, int prec)
{
    if (v != v) {
        put_str(o, "nan", 0, ' ');
        return;
    }
    if (v < 0) {
        put(o, '-');
        v = -v;
    }
    if (v > 1e308) {
        put_str(o, "inf", 0, ' ');
        return;
    }
    int exp = 0;
    if (v != 0) {
        while (v >= 10) {
            v /= 10;
            exp++;
        }
        while (v < 1) {
            v *= 10;
            exp--;
        }
    }
    uint64_t scale = 1;
    for (int i = 0; i < prec; i++)
        scale *= 10;
    uint64_t m = (uint64_t)(v * (double)scale + 0.5);
    if (m >= 10 * scale) {  /* rounding carried into a new digit */
        m /= 10;
        exp++;
    }
    put_uint(o, m / scale, 10, 0, 0, ' ', 0);
    if (prec) {
        put(o, '.');
        put_uint(o, m % scale, 10, 0, prec, '0', 0);
    }
    put(o, 'e');
    put(o, exp < 0 ? '-' : '+');
    put_uint(o, (uint64_t)(exp < 0 ? -exp : exp), 10, 0, 2, '0', 0);
}

int vfmt(char *buf, size_t size, const char *f, va_list ap)
{
    struct out o = {buf, size, 0};
    for (; *f; f++) {
        if (*f != '%') {
            put(&o, *f);
            continue;
        }
        f++;
        char pad = ' ';
        int width = 0, lng = 0, prec = -1, alt = 0;
        for (;; f++) {
            if (*f == '0')
                pad = '0';
            else if (*f == '#')
                alt = 1;
            else
                break;
        }
        while (*f >= '0' && *f <= '9')
            width = width * 10 + (*f++ - '0');
        if (*f == '.') {
            prec = 0;
            for (f++; *f >= '0' && *f <= '9'; f++)
                prec = prec * 10 + (*f - '0');
        }
        while (*f == 'l' || *f == 'z') {
            lng++;
            f++;
        }
        switch (*f) {
        case 'd':
        case 'i': {
            int64_t v = lng ? va_arg(ap, int64_t) : va_arg(ap, int);
            put_uint(&o, v < 0 ? (uint64_t)-v : (uint64_t)v, 10, 0, width, pad, v < 0);
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = lng ? va_arg(ap, uint64_t) : va_arg(ap, unsigned);
            if (alt && *f != 'u')
                put_str(&o, "0x", 0, ' ');
            put_uint(&o, v, *f == 'u' ? 10 : 16, *f == 'X', width, pad, 0);
            break;
        }
        case 'p':
            put_str(&o, "0x", 0, ' ');
            put_uint(&o, (uint64_t)(uintptr_t)va_arg(ap, void *), 16, 0, width, pad, 0);
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            put_str(&o, s ? s : "(null)", width, ' ');
            break;
        }
        case 'c':
            put(&o, (char)va_arg(ap, int));
            break;
        case 'e':
            put_exp(&o, va_arg(ap, double), prec < 0 ? 3 : prec);
            break;
        case '%':
            put(&o, '%');
            break;
        default:
            put(&o, '%');
            if (*f)
                put(&o, *f);
            else
                f--;
        }
    }
    if (size)
        buf[o.len < size ? o.len : size - 1] = 0;
    return (int)o.len;
}

int fmt(char *buf, size_t size, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vfmt(buf, size, f, ap);
    va_end(ap);
    return n;
}
