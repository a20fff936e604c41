"""The spectral cascade over training (SPEC B.3): the routing rank of every head at every
checkpoint of a training run of the project's trainer (``run_dir/checkpoints/step_*`` and
``run_dir/final``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from tl_spectral.geometry.model import model_qk_geometry, model_sd_geometry
from tl_spectral.results import Result, register_result

__all__ = ["CascadeResult", "cascade_over_training", "checkpoint_dirs", "latest_model_dir"]


@register_result
@dataclasses.dataclass
class CascadeResult(Result):
    """Routing rank per layer over training (SPEC B.3), one entry per checkpoint.

    steps: ``[n_ckpt]``. rank_R, routing_fraction_R: ``[n_ckpt, layer, head]`` entropy
    effective rank of R and ‖R‖²/‖M‖² from the (LayerNorm-folded) kernel W_Q W_Kᵀ.
    rank_S, routing_fraction_S: ``[n_ckpt, layer, head]`` rank of S and ‖S‖²/‖S − D‖²
    (S–D models only, else None). val_loss: the run's validation losses at the checkpoint
    steps where it evaluated (``[n_ckpt]``, NaN-free: steps without evaluation hold -1).
    """

    kind: ClassVar[str] = "routing_cascade"
    array_shapes = {
        "steps": "int[ckpt]", "rank_R": "float?[ckpt, layer, head]",
        "routing_fraction_R": "float?[ckpt, layer, head]", "val_loss": "float[ckpt]",
        "rank_S": "float?[ckpt, layer, head]", "routing_fraction_S": "float?[ckpt, layer, head]",
    }
    array_dims = {"layer": "d_head"}

    run_name: str
    attention: str
    d_head: list
    steps: torch.Tensor
    rank_R: torch.Tensor
    routing_fraction_R: torch.Tensor
    val_loss: torch.Tensor
    rank_S: torch.Tensor | None = None
    routing_fraction_S: torch.Tensor | None = None

    def rank(self) -> torch.Tensor:
        """The routing rank followed by the cascade, ``[n, layer, head]``: S for S–D models,
        else R."""
        return self.rank_S if self.rank_S is not None else self.rank_R

    def plot(self, ax: Any = None, which: str = "auto"):
        """Mean routing rank per layer vs training step (one line per layer). ``which``:
        "auto" (S for S–D models, else R), "S" or "R". Returns a Figure."""
        return self._draw("plot", ax=ax, which=which)


def checkpoint_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete checkpoint of a run (and its final model)."""
    out = []
    root = run_dir / "checkpoints"
    for p in sorted(root.glob("step_*")) if root.is_dir() else []:
        if (p / "trainer_state.json").is_file() and (p / "model.safetensors").is_file():
            out.append((int(p.name.split("_")[1]), p))
    if (run_dir / "final" / "model.safetensors").is_file():
        meta = json.loads((run_dir / "final" / "config.json").read_text())
        s = int(meta.get("metrics", {}).get("steps", -1))
        out = [(st, p) for st, p in out if st != s] + [(s, run_dir / "final")]
    return sorted(out)


def cascade_over_training(run_dir: str | Path, *, name: str | None = None) -> CascadeResult:
    """Routing rank per layer and head for every checkpoint of a training run
    (``run_dir/checkpoints/step_*`` and ``run_dir/final``)."""
    from tl_spectral.models.gpt import load_checkpoint

    run_dir = Path(run_dir)
    ck = checkpoint_dirs(run_dir)
    if not ck:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}/checkpoints")
    evals: dict[int, float] = {}
    for sp in sorted((run_dir / "checkpoints").glob("step_*/trainer_state.json")):
        for e in json.loads(sp.read_text()).get("history", {}).get("evals", []):
            evals[int(e["step"])] = float(e["val_loss"])
    steps, rr, fr, rs, fs = [], [], [], [], []
    model = None
    for s, p in ck:
        model = load_checkpoint(p)
        # rotary models: R is read at offset 0 (the kernel W_Q W_Kᵀ); an S–D layer's S is the
        # d_head × d_head form before the rotation, the same at every offset
        rotary = getattr(model.cfg, "positional", "learned") == "rotary"
        g = model_qk_geometry(model, biases=False, allow_rotary=rotary)
        steps.append(s)
        rr.append(g.eff_rank_R)
        fr.append(g.routing_fraction)
        if any(model.cfg.layer_attention(i) == "sd" for i in range(model.cfg.n_layers)):
            sg = model_sd_geometry(model)
            rs.append(sg.eff_rank_S)
            fs.append(sg.routing_fraction)
    assert model is not None
    kinds = sorted({model.cfg.layer_attention(i) for i in range(model.cfg.n_layers)})
    return CascadeResult(
        run_name=name or run_dir.name, attention="+".join(kinds), d_head=model.cfg.d_heads,
        steps=torch.tensor(steps), rank_R=torch.stack(rr), routing_fraction_R=torch.stack(fr),
        val_loss=torch.tensor([evals.get(s, -1.0) for s in steps], dtype=torch.float64),
        rank_S=torch.stack(rs) if rs else None,
        routing_fraction_S=torch.stack(fs) if fs else None)


def latest_model_dir(run_dir: str | Path) -> tuple[Path, int, bool]:
    """(directory, step, finished) of a run's final model, else of its last checkpoint."""
    ck = checkpoint_dirs(Path(run_dir))
    if not ck:
        raise FileNotFoundError(f"no checkpoint or final model under {run_dir}")
    step, path = ck[-1]
    return path, step, path.name == "final"
