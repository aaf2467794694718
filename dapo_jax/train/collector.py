"""One batch's collection, the same for both loops: generation rounds (sample -> score ->
gather, `rounds.generate_round`) fed to dynamic sampling's `BatchFiller` until the batch is
full, then the kept groups with every metric of the batch: dynamic sampling's summary over its
rounds, accuracy per difficulty level, and `rounds.batch_extras` (verifier errors and prompts
cut since the batch's first round, the overlong ramp, the paged pool, reflection phrases, the
pre-filter). The synchronous step drives a Collector to the end at once (`collect`); the
pipeline (train/pipeline.py) drives one a round at a time, between its other work.
"""
import dataclasses
import functools

from dapo_jax import rewards
from dapo_jax.train import dynamic_sampling, levels, rounds
from dapo_jax.train.groups import Groups
from dapo_jax.train.run import Run


@dataclasses.dataclass
class Collector:
  """The batch that step `step` trains, under way: `round()` until `done`, then `result()`."""
  filler: dynamic_sampling.BatchFiller
  step: int
  data_state: dict          # the prompt iterator before its first round (a resume restarts there)
  errors_before: int        # the verifier's error count before its first round
  truncated_before: int     # prompts cut before its first round
  tally: levels.LevelTally  # accuracy per difficulty level over its rounds

  @classmethod
  def start(cls, run: Run, step: int, *, between_chunks=None) -> "Collector":
    """A new batch for step `step`. between_chunks: the sampler's hook between decode chunks
    (the pipeline's partial rollouts)."""
    cfg, algo = run.cfg, run.cfg.algo
    tally = levels.for_run(cfg, run.task.decode)
    generate = functools.partial(rounds.generate_round, run, step=step,
                                 between_chunks=between_chunks)
    filler = dynamic_sampling.BatchFiller(
        tally.wrap(generate), batch_size=cfg.train.batch_size,
        gen_batch_size=algo.gen_batch_size, max_gen_rounds=algo.max_gen_rounds,
        dynamic=algo.dynamic_sampling)
    return cls(filler, step, run.data.state(), rewards.verifier_errors(),
               run.data.num_truncated, tally)

  @property
  def done(self) -> bool:
    return self.filler.done

  def round(self) -> None:
    """One generation round (DynamicSamplingError when the last allowed one leaves it short)."""
    self.filler.round()

  def result(self, run: Run) -> tuple[Groups, dict]:
    """(the kept groups, the batch's metrics), once `done`."""
    batch, summary, _ = self.filler.result()
    return batch, (summary | rounds.batch_extras(run, batch, self.errors_before,
                                                 self.truncated_before) | self.tally.metrics())


def collect(run: Run) -> tuple[Groups, dict]:
  """This step's batch, collected now: sample and score groups; with dynamic sampling keep only
  mixed ones (DAPO §3.2)."""
  collector = Collector.start(run, run.loop.step)
  while not collector.done:
    collector.round()
  return collector.result(run)
