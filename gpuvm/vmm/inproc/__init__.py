"""Guests in-process: the guest program built as a host shared library, run on a thread
of this process, with its BAR accesses and port writes delivered by ctypes callbacks.

Modules: loader (a private copy of the library per guest, so each guest has its own C
globals), bar_pages (BAR remap through page tables the guest consults), runner
(InprocRunner: callbacks, thread, outcome).
"""
