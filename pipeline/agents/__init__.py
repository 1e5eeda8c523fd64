"""The agents nightshift ships, registered by entry point (pyproject.toml) like any user's."""
