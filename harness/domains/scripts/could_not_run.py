"""The opening of every reproduction script: an error the script did not expect (a missing
package, an API that moved) exits 2, never 1, so that it cannot read as "the defect is present".
``harness.domains.repro.COULD_NOT_RUN`` is this file from its first import on."""

import sys as _sys


def _could_not_run(kind, value, traceback):  # type: ignore[no-untyped-def]  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run
