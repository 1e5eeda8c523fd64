"""The `nightshift` command."""
