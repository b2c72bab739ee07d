"""Code generation backends: one sub-package per target language (today TileLang)."""
