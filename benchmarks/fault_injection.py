"""Randomized fault injection for the trainer's checkpoints (issue #15).

Each trial trains a tiny GPT in a fresh ``out_dir`` in a child process and kills it with
SIGKILL several times before letting it finish, resuming each time:

- ``timer`` kills land at a random moment of the run (saves are every step, so many hit a
  save);
- ``io`` kills land at a random I/O operation of a save (a file write, which is then left
  torn at a random length, a rename, a folder removal);
- between restarts, with probability ``--corrupt``, one bit of a random file of the newest
  checkpoint is flipped (or a NaN is written into its Adam moments with valid checksums):
  the resume must detect it and fall back to the previous checkpoint.

At the end the final weights must equal those of an uninterrupted run bit for bit and
``log.jsonl`` must hold every step once. Prints one JSON line::

    python benchmarks/fault_injection.py --budget 180 --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 11
STEPS = 30


def _trainer(out_dir: str | None):
    import torch

    from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer

    g = torch.Generator().manual_seed(0)
    n = 3000
    data = torch.where(torch.rand(n, generator=g) < 0.8, torch.arange(n) % VOCAB,
                       torch.randint(0, VOCAB, (n,), generator=g))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layers=1, n_heads=2, d_model=16, n_ctx=16,
                          d_mlp=32))
    cfg = TrainConfig(steps=STEPS, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2,
                      eval_every=5, eval_windows=4, checkpoint_every=1, keep_checkpoints=2,
                      progress=False, seed=0, device="cpu", log_every=1, num_threads=1,
                      out_dir=out_dir)
    return Trainer(model, data[:2600], data[2600:], cfg)


def child(out_dir: str | None, kill_at: int, seed: int) -> None:
    """Train to the end (resuming from ``out_dir``); with ``kill_at`` > 0, SIGKILL itself
    at that I/O operation of a save. Prints the sha256 of the final weights."""
    import shutil

    import torch

    torch.set_num_threads(1)
    import tl_spectral.models.gpt as gpt
    import tl_spectral.models.train as train

    if kill_at > 0:
        rng = random.Random(seed)
        count = [0]

        def hit() -> bool:
            count[0] += 1
            return count[0] == kill_at

        def die() -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        real_write = gpt.write_file_durably

        def write(path, data):
            if hit():
                with open(path, "wb") as f:
                    f.write(data[:rng.randrange(len(data) + 1)])
                die()
            real_write(path, data)

        def wrap(fn):
            def inner(*a, **k):
                if hit():
                    die()
                return fn(*a, **k)
            return inner

        gpt.write_file_durably = train.write_file_durably = write
        os.replace = wrap(os.replace)
        shutil.rmtree = wrap(shutil.rmtree)
        gpt._rename_exchange = wrap(gpt._rename_exchange)
    t = _trainer(out_dir)
    print(json.dumps({"resumed_from": t.step,
                      "rejected": [str(p) for p, _ in t.rejected_checkpoints]}), flush=True)
    t.fit()
    h = hashlib.sha256()
    for k, v in sorted(train.model_state(t.model).items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    print(json.dumps({"final_sha256": h.hexdigest()}), flush=True)


def _spawn(out_dir: str, kill_at: int, seed: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, __file__, "--child", out_dir, str(kill_at),
                             str(seed)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _records(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _corrupt(out_dir: Path, rng: random.Random) -> Path | None:
    """Damage the newest checkpoint: a flipped bit in one of its files, or NaN Adam
    moments re-recorded with valid checksums. Returns the folder, or None."""
    cks = sorted((out_dir / "checkpoints").glob("step_*"))
    if len(cks) < 2:  # keep one intact checkpoint to fall back to
        return None
    ck = cks[-1]
    if rng.random() < 0.25:
        from safetensors.torch import load_file, save_file

        sys.path.insert(0, str(ROOT))
        from tl_spectral.models.gpt import sha256_bytes
        from tl_spectral.models.train import _canonical

        f = ck / "trainer_state.safetensors"
        t = load_file(str(f))
        key = rng.choice(sorted(k for k in t if "exp_avg" in k))
        t[key] = t[key].clone()
        t[key].view(-1)[rng.randrange(t[key].numel())] = float("nan")
        _corrupt.last = "nan:" + key  # type: ignore[attr-defined]
        save_file(t, str(f))
        meta = json.loads((ck / "trainer_state.json").read_text())
        meta["files"][f.name] = sha256_bytes(f.read_bytes())
        meta.pop("meta_sha256", None)
        meta["meta_sha256"] = sha256_bytes(_canonical(meta).encode())
        (ck / "trainer_state.json").write_text(json.dumps(meta))
        return ck
    f = rng.choice(sorted(p for p in ck.iterdir() if p.is_file()))
    _corrupt.last = f.name  # type: ignore[attr-defined]
    raw = bytearray(f.read_bytes())
    i = rng.randrange(len(raw))
    raw[i] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(raw))
    return ck


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=180.0, help="seconds of trials")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kills", type=int, default=4, help="kills per trial (at most)")
    ap.add_argument("--corrupt", type=float, default=0.3,
                    help="probability of damaging the newest checkpoint after a kill")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    t_start = time.perf_counter()

    ref = _spawn("", 0, 0)  # uninterrupted, no out_dir
    out, err = ref.communicate(timeout=600)
    ref_time = time.perf_counter() - t_start
    if ref.returncode:
        raise SystemExit(f"reference run failed:\n{err[-2000:]}")
    ref_sha = _records(out)[-1]["final_sha256"]

    stats = {"trials": 0, "kills_tried": 0, "kills_timer": 0, "kills_in_save_io": 0,
             "kills_missed": 0, "corruptions_injected": 0, "corruptions_detected": 0,
             "corruptions_overwritten": 0, "undetected": [],
             "checkpoints_broken": 0, "runs_bit_identical": 0, "logs_without_repeats": 0,
             "failures": []}
    with tempfile.TemporaryDirectory(prefix="tl_fault_") as tmp:
        while time.perf_counter() - t_start < args.budget:
            trial = stats["trials"]
            out_dir = Path(tmp) / f"trial{trial}"
            stats["trials"] += 1
            injected: set[str] = set()
            what: dict[str, str] = {}
            final_sha = None
            for attempt in range(args.kills + 1):
                last = attempt == args.kills
                mode = "none" if last else rng.choice(["timer", "io"])
                kill_at = rng.randint(1, 150) if mode == "io" else 0
                p = _spawn(str(out_dir), kill_at, rng.randrange(1 << 30))
                if mode == "timer":
                    try:
                        p.wait(timeout=rng.uniform(0.3, ref_time))
                    except subprocess.TimeoutExpired:
                        p.send_signal(signal.SIGKILL)
                out, err = p.communicate(timeout=600)
                recs = _records(out)
                for r in recs:
                    for bad in r.get("rejected", []):
                        if bad in injected:
                            stats["corruptions_detected"] += 1
                            injected.discard(bad)
                        else:
                            stats["checkpoints_broken"] += 1
                if p.returncode == -signal.SIGKILL:
                    stats["kills_tried"] += 1
                    stats["kills_timer" if mode == "timer" else "kills_in_save_io"] += 1
                    if rng.random() < args.corrupt:
                        ck = _corrupt(out_dir, rng)
                        if ck is not None and str(ck) not in injected:  # count folders
                            stats["corruptions_injected"] += 1
                            injected.add(str(ck))
                            what[str(ck)] = _corrupt.last  # type: ignore[attr-defined]
                    continue
                if p.returncode != 0:
                    stats["failures"].append({"trial": trial, "rc": p.returncode,
                                              "stderr": err[-400:]})
                    break
                if mode != "none":
                    stats["kills_missed"] += 1  # finished before the kill
                final_sha = recs[-1]["final_sha256"]
                break
            if final_sha is None:  # every attempt was killed: finish undisturbed
                p = _spawn(str(out_dir), 0, 0)
                out, err = p.communicate(timeout=600)
                if p.returncode == 0:
                    final_sha = _records(out)[-1]["final_sha256"]
                else:
                    stats["failures"].append({"trial": trial, "rc": p.returncode,
                                              "stderr": err[-400:]})
            stats["runs_bit_identical"] += int(final_sha == ref_sha)
            for ck in injected:  # damaged, never resumed from: overwritten by a later save
                stats["corruptions_overwritten"] += 1
                stats["undetected"].append(what[ck])
            log = out_dir / "log.jsonl"
            steps = [json.loads(x)["step"] for x in log.read_text().splitlines()
                     if "loss" in json.loads(x)] if log.is_file() else []
            stats["logs_without_repeats"] += int(steps == list(range(1, STEPS + 1)))
    stats["seconds"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
