/* The VMM ports.  Strings and records are built in one guest-RAM page because the VMM
 * reads them at guest-physical addresses (on the host build the stack and .rodata are
 * not guest memory). */
#include "lib.h"
#include "platform.h"

#define LINE_MAX 3072

struct io_page {
    char line[LINE_MAX];
    struct gpuvm_wait wait;
};

static struct io_page *io;

void io_init(void)
{
    io = ram_alloc(sizeof(*io));
}

static void send_line(uint32_t port, const char *f, va_list ap)
{
    if (!io)
        return;
    vfmt(io->line, sizeof(io->line), f, ap);
    plat_out(port, (uint32_t)plat_virt_to_phys(io->line));
}

void con_puts(const char *s)
{
    con_printf("%s", s);
}

void con_printf(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    send_line(PORT_CONSOLE, f, ap);
    va_end(ap);
}

void result_printf(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    send_line(PORT_RESULT, f, ap);
    va_end(ap);
}

void phase_mark(unsigned phase)
{
    plat_out(PORT_PHASE, phase);
}

uint32_t wait_fence(uint64_t addr, uint32_t value, uint64_t timeout_ns)
{
    io->wait.addr = addr;
    io->wait.value = value;
    io->wait.status = WAIT_TIMEOUT;
    io->wait.timeout_ns = timeout_ns;
    plat_out(PORT_WAIT, (uint32_t)plat_virt_to_phys(&io->wait));
    return *(volatile uint32_t *)&io->wait.status;
}

int32_t hypercall(struct gpuvm_hcall *call)
{
    call->status = HC_EINVAL;
    plat_out(PORT_HYPERCALL, (uint32_t)plat_virt_to_phys(call));
    return *(volatile int32_t *)&call->status;
}
