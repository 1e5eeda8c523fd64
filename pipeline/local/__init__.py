"""Running nightshift on one machine: the demo and real worker/beat processes."""
