"""Layer 3: storage and reports. Everything that reads or writes files, or looks at the machine:
atomic writes (once, in :mod:`harness.storage.atomic`), baselines, run reports, hardware
profiles, provenance and hardware detection."""
