"""The chaos harness: real workers, a seeded schedule of faults, and the proof."""
