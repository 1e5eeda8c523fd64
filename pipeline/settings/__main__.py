"""`python -m pipeline.settings` prints docs/configuration.md's settings table, generated from the
declaration in `pipeline.settings.Settings`."""

from pipeline.settings import settings_table

print(settings_table(), end="")
