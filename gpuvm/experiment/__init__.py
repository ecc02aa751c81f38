"""Experiments: a TOML file of scenarios x modes x policies x repetitions (`config`), run
into a results directory (`execute`, `rundir`), reported against the paper (`report`,
`paper`); `gpuvm experiment` is `cli`."""
