"""gpuvm seen through libvirt: the host's GPU and its vGPUs as node devices, VMs as domains.

People who run VMs with vGPUs describe each VM as a libvirt domain whose mediated-device
hostdev names a vGPU's UUID, and look at the host's GPU and its vGPU types with
`virsh nodedev-*`.  gpuvm speaks that language through libvirt-python and libvirt's
embedded *test* driver (no libvirtd, no QEMU: the guests run on gpuvm's own VMM).

Why a driver file, and why domains are kept in it
-------------------------------------------------
The test driver cannot create node devices through the API (nodeDeviceCreateXML and
DefineXML are refused), but it reads a *driver file* (`test:///ABS/PATH.xml`: a `<node>`
holding `<device>`s and `<domain>`s) when a connection opens.  So gpuvm writes the host's
description there: the GPU as a PCI device with its `mdev_types`, and every mdev defined
with `gpuvm mdev create` as its child.  The file is rewritten from the mdev store whenever
gpuvm opens a connection or changes a vGPU or a domain, so `virsh -c test:///FILE` sees the
same host as `gpuvm mdev list`.

The test driver is embedded per connection: what the API defines lives only as long as
that connection.  Domains therefore go through the API (defineXML, create, shutdown,
destroy, undefine, setMetadata: libvirt parses, validates and round-trips them), and when a
command has changed one, gpuvm keeps the domain's XML as libvirt returned it and its run
state in the state directory and writes both into the driver file (a `<test:runstate>`
in each `<domain>`).  Every later connection -- gpuvm's or `virsh -c test:///FILE` --
therefore starts with the same domains in the same states.  Writing them into the file,
rather than replaying defineXML into each new connection, is what lets a plain `virsh`
on the file see them too.

Layout (under $GPUVM_STATE_DIR, see gpuvm.state.state_dir):
    libvirt/host.xml              the driver file (derived: never edit it)
    libvirt/domains/NAME.xml      a defined domain, as libvirt wrote it
    libvirt/domains/NAME.state    its last run state (shut off / running) as JSON
"""
