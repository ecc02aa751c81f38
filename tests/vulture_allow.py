"""Names vulture finds unused but the code uses where vulture cannot see it (by a string,
by a library calling back, by C reading a struct), each with how.  Read by
tests/test_code_shape.py as a vulture whitelist: a file of expressions, never imported.
A name that is simply unused is deleted, not listed here."""
# ruff: noqa
# flake8: noqa

# rich renders a Table's caption under it
_.caption
# rich reads a Table's pad_edge and a Column's overflow when it renders (calibrate/cli.py _whole)
_.pad_edge
_.overflow
# xml.parsers.expat calls a parser's handlers (gpuvm/libvirt/domain_xml.py)
_.StartElementHandler
_.EndElementHandler
_.CharacterDataHandler
# the vfio-user fuzzer picks its cases by name: getattr(self, "_" + case)
_._truncated
_._garbage
_._wrong_way
_._replay
_._ending
# started in a child process by name: `python -c "... import serve_target; ..."`
serve_target
# read by name: median(rows, "cpu_per_vm_ms"), getattr(line, "phase_modelled_ms")
cpu_per_vm_ms
phase_modelled_ms
# dataclass fields written out whole with asdict: VmRow to runs.jsonl and results.csv,
# RunStatus to the status file `gpuvm smi` reads
experiment
vram_total
traps_per_s
shadow_syncs
updated
window_s
engine_utilisation
# simpy.Event's own state: a round is triggered by hand (gpuvm/sim/stream_replay.py)
_._ok
# ctypes structures the other side reads: the guest's boot parameters (C) and KVM's
# struct kvm_segment
_.heap_start
_.avl
_.unusable
