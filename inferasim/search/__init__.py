"""Search: configuration space, stage-1 estimates, stage-2 simulation, selection."""
