"""Read models for people (never writes): runs, batches, actions, metrics."""
