"""The DAPO trainer: state, the jitted update, dynamic sampling, checkpoints and the loop."""
