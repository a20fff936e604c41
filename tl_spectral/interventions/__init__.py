"""Experiments on the project's GPT models (maths 2 in docs/architecture.md): they change a
model and measure what the change costs.

- :mod:`~tl_spectral.interventions.ablations`: the SPEC B.4 ablations and rank truncation,
  with ΔPPL.
- :mod:`~tl_spectral.interventions.surgery`: linearization and cascade allocation
  (SPEC B.5–B.6).

Moved here from ``tl_spectral.models`` (the model family, ground floor); the old paths
``tl_spectral.models.surgery`` and ``tl_spectral.models.ablations`` still import, with a
DeprecationWarning, until tl_spectral 0.3. The interventions on any TransformerLens model
that run inside the probe runner (faithfulness curves, zeroing the sink's value) stay with
the probes: :mod:`tl_spectral.probes.damage`.
"""
