"""Shadow structures a mediator keeps per VM: page tables, BAR windows, channels.

Nothing here knows about KVM or threads: these classes read guest structures straight
from VRAM (numpy views), validate every entry against the VM's partition, and write the
hypervisor-owned copies the physical GPU actually uses.
"""
