"""Stage 2, proven equalities: the rewrite-rule registry (``registry``) and its symbolic checks (``symbolic``)."""
