"""An example nightshift agent package: see agent.py and ../README.md."""
