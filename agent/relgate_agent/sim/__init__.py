"""Fleet simulator: flow-level, discrete-event model of a distribution over a fleet."""
