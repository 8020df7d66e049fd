"""``tuner worker``: claims profiling jobs from the service, runs each profile in a
subprocess of its own (``profile_run``), renews its lease while it works (``loop``).
Torch-free: the device is described by a child process that imports torch."""
