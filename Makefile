# The two front-door commands: `make run` (the default experiment) and `make test`.
# Each installs what is missing first, idempotently: the virtualenv, the package with its
# test extras, and the guest binaries (built with the machine's gcc).  Debian packages
# (gcc, libvirt) are installed with apt only when missing (as root).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install guest libvfio-user run paper test bench clean

$(STAMP): pyproject.toml
	@command -v gcc >/dev/null || (apt-get update -qq && apt-get install -y -qq gcc make)
	@test -f /usr/include/linux/vfio.h || (apt-get update -qq && apt-get install -y -qq linux-libc-dev)
	@# libvirt-python compiles against the system libvirt: pkg-config finds libvirt-dev's
	@# headers; libvirt-clients brings virsh and virt-xml-validate (with libvirt's schemas),
	@# which runs libxml2-utils' xmllint
	@(command -v pkg-config >/dev/null && pkg-config --exists libvirt && command -v virsh \
	  >/dev/null && command -v virt-xml-validate >/dev/null && command -v xmllint >/dev/null) \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      libvirt-dev libvirt-clients libxml2-utils pkg-config)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	@touch $@

install: $(STAMP)

guest: install
	$(VPY) -m gpuvm build-guest

run: guest
	$(VPY) -m gpuvm experiment experiments/default.toml

# The paper's whole evaluation: overhead, scaling, isolation, then one report beside the
# paper's numbers (results/paper/latest/report.md); under 1.5 minutes on 2 idle cores
# (about 100 s of CPU).
paper: guest
	$(VPY) -m gpuvm experiment experiments/paper.toml

# Nutanix libvfio-user from ../shared/third_party, patched and built in build/libvfio-user
# for the vfio-user interop tests (tests/libvfio_user.py; says so and does nothing where
# the archive is absent)
libvfio-user: install
	@# it builds with meson and ninja against json-c; its meson setup asks for cmocka too
	@(command -v meson >/dev/null && command -v ninja >/dev/null && command -v patch \
	  >/dev/null && pkg-config --exists json-c && test -f /usr/include/cmocka.h) \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      meson ninja-build libjson-c-dev libcmocka-dev patch pkg-config)
	$(VPY) tests/libvfio_user.py

# Two workers (CI has two cores); whole files to each (--dist loadfile), so a module's
# fixture -- a run of isolated VMs, a recorded bundle -- is built once, not per worker.
test: guest libvfio-user
	$(VPY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests

bench: guest
	$(VPY) -m gpuvm bench device

clean:
	rm -rf $(VENV) guest_tools/build build/libvfio-user results .pytest_cache
