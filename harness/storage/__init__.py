"""Layer 4: storage and reports. Everything that reads or writes the harness's files: atomic
writes (once, in :mod:`harness.storage.atomic`), baselines, run reports and their journals, the
fleet store, hardware profiles (the calibrated classes) and provenance. What the machine is, is
:mod:`harness.platform`'s (layer 2); storage only records it."""
