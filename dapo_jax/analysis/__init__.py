"""The ablation notebook's statistics, read from committed run logs (no JAX).

  ablations   run logs (RunLog, load_runs), per-run endpoints, paired tests, claim records,
              Holm within a family, verdicts.json
  stats       t-tests, Holm, noncentral-t power, Hedges-corrected seed counts, verdict words
  sequential  O'Brien-Fleming group-sequential bounds, sequential p, repeated CIs
  confirm     a pre-registration's looks and confirmatory verdicts
  mechanisms  whether a claim's mechanism is seen acting in a pilot's logged metrics
"""
