/*
 * The isolation probe (benchmark "probe"): tries to read and then write memory through
 * one access vector and reports what happened.  Boot parameters:
 *   params[0] = vector (below), params[1] = address, params[2] = length (1..4096, def. 16)
 * The address is a guest VRAM address, except for PROBE_SYSRAM (guest-physical).
 * Record: bench=probe vector=<name> addr= len= faulted=0|1 refused=<entries>
 *         data=<hex of the first <=16 bytes read> wrote=0|1 [changed=0|1] check=PASS
 * check=PASS means the probe ran; whether isolation held is for the caller to judge from
 * faulted/data/wrote (a fault is an expected outcome, not a failure).
 */
#ifndef GV_PROBE_H
#define GV_PROBE_H

#define PROBE_CHANNEL_PT 1  /* map addr into the channel's VM (VRAM PTE); the copy engine
                               reads it into sysram, then copies the marker over it */
#define PROBE_BAR1 2        /* map addr into the BAR1 VM; CPU reads/writes through BAR1 */
#define PROBE_BAR3 3        /* map addr into the BAR3 VM; CPU reads/writes through BAR3 */
#define PROBE_PRAMIN 4      /* point the PRAMIN window at addr; CPU reads/writes via BAR0 */
#define PROBE_RAMIN 5       /* a second channel whose RAMIN_USERD (and BAR1 poll page) is
                               the page of addr: read through the poll page, then ring its
                               doorbell, so GP_PUT lands at page+0x8c and the GPU advances
                               GP_GET at +0x88; changed=1 when those 8 bytes changed */
#define PROBE_SYSRAM 6      /* map guest-physical addr (e.g. beyond RAM) with a sysram PTE;
                               the copy engine reads it, then copies the marker over it */
#define PROBE_PV_MAP 7      /* PV build only: PROBE_CHANNEL_PT with the PTE sent by
                               HC_MAP_BATCH (refused= counts entries the hypervisor refused) */

#define PROBE_MARKER 0x4b425250u  /* "PRBK", repeated over the probed range */
#define PROBE_MAX_LEN 4096u
#define PROBE_WAIT_NS 2000000000ull  /* a probe never waits on the GPU longer than 2 s */

#endif
