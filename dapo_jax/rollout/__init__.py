"""Rollout: a JetStream Engine over the policy and the group sampler built on it."""
