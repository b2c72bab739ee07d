"""Stage 5a, code generation: one sub-package per target language (today TileLang); plans arrive validated."""
