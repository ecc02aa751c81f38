/* The guest program: picks the benchmark named in the boot parameters and runs it. */
#include "bench.h"
#include "lib.h"
#include "params.h"
#include "platform.h"

static const struct bench benches[] = {
    {"vecadd", {1u << 20}, bench_vecadd},
    {"madd", {512}, bench_madd},
    {"mmul", {256}, bench_mmul},
    {"fmadd", {1u << 20}, bench_fmadd},
    {"memcpy", {16u << 20}, bench_memcpy},
    {"loop", {1u << 20}, bench_loop},
    {"idle", {0}, bench_idle},
    {"probe", {0, 0, 16}, bench_probe},
    {"hostmem", {1u << 20, 8, 0, 0}, bench_hostmem},
};

static struct bench_run run;

static int bench_main(struct gpuvm_boot_params *bp)
{
    ram_init(bp);
    io_init();
    if (bp->magic != BOOT_MAGIC || bp->version != BOOT_VERSION) {
        con_printf("boot parameters: bad magic %#x or version %u", bp->magic, bp->version);
        return 2;
    }
    char name[BOOT_BENCH_NAME_LEN];
    memcpy(name, bp->bench, sizeof(name));
    name[sizeof(name) - 1] = 0;
    for (unsigned i = 0; i < ARRAY_SIZE(benches); i++) {
        const struct bench *b = &benches[i];
        if (strcmp(b->name, name))
            continue;
        memset(&run, 0, sizeof(run));
        run.bp = bp;
        run.name = b->name;
        for (unsigned p = 0; p < BENCH_NUM_PARAMS; p++)
            run.param[p] = bp->params[p];
        for (unsigned p = 0; p < ARRAY_SIZE(b->defaults); p++)
            if (!run.param[p])
                run.param[p] = b->defaults[p];
        return b->run(&run);
    }
    con_printf("no benchmark named '%s'", name);
    result_printf("bench=%s check=FAIL reason=unknown_benchmark", name);
    return 2;
}

int guest_main(struct gpuvm_boot_params *bp)
{
    return plat_run(bench_main, bp);
}
