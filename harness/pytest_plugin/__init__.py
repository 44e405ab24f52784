"""Layer 5: the pytest plugin. ``hooks`` is the ``pytest11`` entry module (hooks only);
``options`` parses the command line, ``state`` keeps the session on ``config.stash``,
``recording`` turns verdicts into rows and assertions, ``fixtures`` hands suites narrow
collaborators. Nothing here decides a verdict: the layers below do."""
