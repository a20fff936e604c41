"""Bootstrap intervals over documents.

Every statistic a verdict rests on is a function of an ensemble of documents. Its
uncertainty is the spread of the statistic over ensembles resampled from the documents
with replacement (the nonparametric bootstrap, percentile intervals).

- :func:`resample_indices` — the resampled document indices (seeded, reproducible);
- :func:`bootstrap` — a statistic ``f(idx) -> float | Tensor`` evaluated on the full
  ensemble (``idx = arange(N)``) and on every resample, returned as an :class:`Interval`
  (scalar) or a :class:`Intervals` (elementwise, any shape);
- :func:`centred_gram_resample` — the Gram matrix of a resampled ensemble's fluctuations
  (about the *resample's* mean) from the Gram matrix of the full ensemble's fluctuations,
  so POD eigenvalues of each resample cost one ``[N, N]`` eigen-decomposition and no pass
  over the fields;
- :func:`group_jackknife` / :func:`jackknife_interval` — the delete-a-group jackknife over
  documents (for statistics that depend on the ensemble size, H* and T_spec: each replicate
  keeps (1 − 1/G) of the documents, all distinct; standard error
  ``sqrt((G − 1)/G · Σ_g (θ_g − θ̄)²)``, interval ``θ̂ ± t_{G−1} · se``);
- :func:`t_interval` — the t-interval of a mean (e.g. over heads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
from torch import Tensor

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0
DEFAULT_LEVEL = 0.95


def resample_indices(n_docs: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                     ) -> Tensor:
    """``[n_resamples, n_docs]`` document indices drawn with replacement by a seeded generator."""
    n_docs, n_resamples = int(n_docs), int(n_resamples)
    if n_docs < 2:
        raise ValueError(f"a bootstrap needs at least 2 documents, got {n_docs}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, n_docs, (n_resamples, n_docs), generator=g)


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    return level


@dataclass(frozen=True)
class Interval:
    """A scalar estimate with its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL
    n_resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED

    def excludes(self, value: float) -> bool:
        """True when ``value`` lies outside the interval."""
        return not (self.low <= value <= self.high)

    def format(self, digits: int = 3) -> str:
        """``"0.631 [0.602, 0.655]"`` with ``digits`` significant digits."""
        f = (lambda x: f"{x:.{digits}g}")
        return f"{f(self.estimate)} [{f(self.low)}, {f(self.high)}]"

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high,
                "level": self.level, "n_resamples": self.n_resamples, "seed": self.seed}

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class Intervals:
    """Elementwise estimates with percentile bootstrap intervals (tensors of one shape)."""

    estimate: Tensor
    low: Tensor
    high: Tensor
    level: float = DEFAULT_LEVEL
    n_resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED

    def __getitem__(self, index) -> Union["Interval", "Intervals"]:
        e, lo, hi = self.estimate[index], self.low[index], self.high[index]
        if e.dim() == 0:
            return Interval(float(e), float(lo), float(hi), self.level, self.n_resamples, self.seed)
        return Intervals(e, lo, hi, self.level, self.n_resamples, self.seed)

    def to_dict(self) -> dict:
        return {"estimate": self.estimate.tolist(), "low": self.low.tolist(),
                "high": self.high.tolist(), "level": self.level,
                "n_resamples": self.n_resamples, "seed": self.seed}


def percentile_interval(estimate: Tensor | float, replicates: Tensor, level: float = DEFAULT_LEVEL,
                        ) -> tuple[Tensor, Tensor]:
    """Percentile interval of ``replicates [R, ...]`` at ``level`` (NaN replicates ignored)."""
    level = _check_level(level)
    a = (1.0 - level) / 2.0
    r = replicates.double()
    lo = torch.nanquantile(r, a, dim=0)
    hi = torch.nanquantile(r, 1.0 - a, dim=0)
    return lo, hi


def bootstrap(statistic: Callable[[Tensor], Union[float, Tensor]], n_docs: int, *,
              n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              level: float = DEFAULT_LEVEL, progress: bool = False,
              ) -> Union[Interval, Intervals]:
    """Percentile bootstrap of ``statistic`` over ``n_docs`` documents.

    ``statistic(idx)`` receives a ``LongTensor [n_docs]`` of document indices (with repeats
    in a resample) and returns a float or a tensor of a fixed shape. The estimate is
    ``statistic(arange(n_docs))``. Returns an :class:`Interval` for scalars, an
    :class:`Intervals` for tensors.
    """
    level = _check_level(level)
    idx = resample_indices(n_docs, n_resamples, seed)
    est = torch.as_tensor(statistic(torch.arange(int(n_docs))), dtype=torch.float64)
    it = range(idx.shape[0])
    if progress:
        from tl_spectral.progress import progress_bar as tqdm

        it = tqdm(it, desc="bootstrap", unit="resample")
    reps = []
    for r in it:
        v = torch.as_tensor(statistic(idx[r]), dtype=torch.float64)
        if v.shape != est.shape:
            raise ValueError(
                f"the statistic returned shape {tuple(v.shape)} on a resample but "
                f"{tuple(est.shape)} on the full ensemble; return a fixed shape"
            )
        reps.append(v)
    lo, hi = percentile_interval(est, torch.stack(reps), level)
    if est.dim() == 0:
        return Interval(float(est), float(lo), float(hi), level, int(n_resamples), int(seed))
    return Intervals(est, lo, hi, level, int(n_resamples), int(seed))


def mean_interval(values: Tensor, **kwargs) -> Union[Interval, Intervals]:
    """Bootstrap interval of the mean over documents of ``values [N, ...]``."""
    values = torch.as_tensor(values, dtype=torch.float64)
    return bootstrap(lambda i: values[i].mean(dim=0), values.shape[0], **kwargs)


def centred_gram_resample(gram: Tensor, idx: Tensor) -> Tensor:
    """Gram matrix of a resampled ensemble's fluctuations about the resample's own mean.

    ``gram [N, N]`` holds ``<u_s, u_t>`` for fluctuations about any fixed reference (the full
    ensemble's mean, say). For a resample ``idx`` the fluctuations about the resample's mean
    are ``u_{idx_a} - ū_idx``; their Gram matrix is the double-centred submatrix
    ``(I - 11ᵀ/n) G[idx][:, idx] (I - 11ᵀ/n)`` — exact, no pass over the fields.
    Divide by ``n`` for the POD's ``K = X Xᵀ / N`` convention.
    """
    if gram.dim() != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be a square [N, N] matrix, got shape {tuple(gram.shape)}")
    g = gram[idx][:, idx]
    r = g.mean(dim=1, keepdim=True)
    c = g.mean(dim=0, keepdim=True)
    return g - r - c + g.mean()


def document_groups(n_docs: int, n_groups: int, seed: int = 0) -> list[Tensor]:
    """The delete-a-group jackknife's groups of documents: ``randperm(n_docs)`` (seeded)
    cut into ``min(n_groups, n_docs)`` chunks (fewer when the chunks come out short). The
    in-memory jackknife (:func:`group_jackknife`) and the
    streaming probe's per-group statistics use this one split."""
    g = torch.Generator().manual_seed(int(seed))
    return list(torch.randperm(int(n_docs), generator=g).chunk(max(1, min(int(n_groups), int(n_docs)))))


#: groups of the delete-a-group jackknife (at most the number of documents)
JACKKNIFE_GROUPS = 8


def group_jackknife(statistic: Callable[[torch.Tensor], Any], n_docs: int, *,
                    n_groups: int = JACKKNIFE_GROUPS, seed: int = 0,
                    level: float = 0.95) -> dict[str, Any]:
    """Delete-a-group jackknife of ``statistic(idx) -> Tensor`` over documents (:func:`jackknife_interval`).
    Returns ``{"estimate", "low", "high", "se", "replicates"}`` tensors and ``"meta"``."""
    n_docs = int(n_docs)
    if n_docs < 2:
        raise ValueError(f"the jackknife needs at least 2 documents, got {n_docs}")
    groups = document_groups(n_docs, n_groups, seed)
    est = torch.as_tensor(statistic(torch.arange(n_docs)), dtype=torch.float64)
    reps = []
    for grp in groups:
        keep = torch.ones(n_docs, dtype=torch.bool)
        keep[grp] = False
        reps.append(torch.as_tensor(statistic(torch.nonzero(keep).flatten()),
                                    dtype=torch.float64))
    return jackknife_interval(est, torch.stack(reps), seed=seed, level=level)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom: ``scipy.special.
    stdtrit`` (what ``scipy.stats.t.ppf`` returns, without importing ``scipy.stats``: a
    second of imports)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def jackknife_interval(est: torch.Tensor, replicates: torch.Tensor, *, seed: int = 0,
                       level: float = 0.95) -> dict[str, Any]:
    """The delete-a-group interval of an estimate from its ``G`` replicates ``[G, …]``
    (module docstring): ``{"estimate", "low", "high", "se", "replicates", "meta"}``."""
    R = replicates
    G = R.shape[0]
    se = torch.sqrt((G - 1) / G * ((R - R.mean(0)) ** 2).sum(0))
    q = t_quantile(0.5 + level / 2, G - 1)
    return {"estimate": est, "low": est - q * se, "high": est + q * se, "se": se,
            "replicates": R,
            "meta": {"n_groups": int(G), "seed": int(seed), "level": float(level),
                     "t_quantile": q}}


def t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Mean of ``values`` with its t-interval (n ≥ 2): mean ± t(0.5 + level/2, n − 1) · sd/√n."""
    v = [float(x) for x in values]
    n = len(v)
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 values, got {n}")
    m = sum(v) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return {"estimate": m, "low": m - half, "high": m + half, "n": n}
