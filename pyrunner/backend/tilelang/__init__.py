"""TileLang backend: render a validated plan as a TileLang module, lower it, compile it."""
