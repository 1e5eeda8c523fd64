"""One durable step: leases, the journal, tool calls, actions, timers, budgets, model
adapters, artifacts."""
