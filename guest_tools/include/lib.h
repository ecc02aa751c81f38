/* Freestanding support: memory/string functions, formatting, guest RAM pages and the
 * VMM ports (console, results, phases, waits, hypercalls). */
#ifndef GV_LIB_H
#define GV_LIB_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuvm_abi.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~((uint64_t)(a) - 1))
#define PAGE_SIZE 4096u

/* Error codes (negated in return values). */
enum {
    E_OK = 0,
    E_NOMEM = 12,     /* an allocator ran out */
    E_INVAL = 22,     /* bad argument */
    E_NODEV = 19,     /* the device did not identify as expected */
    E_BUSY = 16,      /* a completion poll did not complete */
    E_FAULT = 14,     /* a channel faulted */
    E_TIMEDOUT = 110, /* a wait timed out */
    E_REFUSED = 1,    /* the hypervisor refused a hypercall */
};
const char *err_name(int err);

/* gcc may emit calls to these, so they exist under their usual names. */
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
int strcmp(const char *a, const char *b);

/* printf subset: %d %i %u %x %X %s %c %p %%, flags 0 and #, width, length l/ll/z,
 * and %e (double, precision default 3).  Always NUL-terminates; returns the length. */
int vfmt(char *buf, size_t size, const char *f, va_list ap);
int fmt(char *buf, size_t size, const char *f, ...) __attribute__((format(printf, 3, 4)));

/* Guest RAM pages (the heap between bp->heap_start and the end of RAM). */
void ram_init(const struct gpuvm_boot_params *bp);
void *ram_alloc(uint64_t bytes);   /* page aligned and zeroed; NULL when out of RAM */
void ram_free(void *p);
uint64_t ram_used(void);

/* Ports. */
void io_init(void);  /* after ram_init: the page strings and records are passed in */
void con_puts(const char *s);
void con_printf(const char *f, ...) __attribute__((format(printf, 1, 2)));
void result_printf(const char *f, ...) __attribute__((format(printf, 1, 2)));
void phase_mark(unsigned phase);
/* Sleeps until the u32 at guest-physical `addr` reaches `value` (timeout_ns 0: the VMM's
 * default limit); returns WAIT_*. */
uint32_t wait_fence(uint64_t addr, uint32_t value, uint64_t timeout_ns);
/* Sends the hypercall record (in guest RAM); returns its status. */
int32_t hypercall(struct gpuvm_hcall *call);

#endif
