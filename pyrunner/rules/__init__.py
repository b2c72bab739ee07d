"""Stage 2, proven equalities: the rewrite-rule registry (``registry``) and its symbolic checks
(``symbolic``: sympy/z3, installed by the ``check`` extra, never needed at run time)."""
