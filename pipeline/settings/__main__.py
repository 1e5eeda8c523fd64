"""`python -m pipeline.settings` prints README.md's configuration table, generated from the
declaration in `pipeline.settings.Settings`."""

from pipeline.settings import readme_table

print(readme_table(), end="")
