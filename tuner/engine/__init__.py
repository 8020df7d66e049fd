"""Measuring where the device is (imports torch): the workload and its fingerprint, the
memory backends, state snapshots, one probe, the search, and the profiler that runs a
search into a ``Profile``.

    workload -> probe(m) -> search picks the next m -> profile

Nothing is imported here, so ``tuner.engine.search`` stays usable without torch.
"""
