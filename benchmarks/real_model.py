"""The four probes on a real-depth model vs its plain forward pass (issue 32 item 1).

Model (``--model``): ``smollm2-135m`` (default): the zoo's SmolLM2-135M when the zoo has it
(``tl_spectral.models.zoo.load("smollm2-135m")``), otherwise — and with ``--random`` — a
random-weight ``LlamaForCausalLM`` of its exact shape (30 layers, 9 query / 3 key-value
heads, d_model 576, d_mlp 1,536, RoPE θ 100,000, RMSNorm, vocabulary 49,152, tied
embeddings) saved to a temporary folder and booted with eager attention (timing does not
depend on the weights' values); ``gpt2-small``: the random GPT-2-small-shaped bridge of
``benchmarks/real_size.py`` (12 layers × 12 heads, d_model 768, LayerNorm).

Configurations: ``all`` (AttentionStatsProbe, ContributionProbe, SinkProbe, AttentionFieldProbe
in one ``run_probes`` pass) and each probe alone (``stats``, ``contributions``, ``sinks``,
``fields``), every one in its own process, one torch thread, on random token ids of
``--batch`` × ``--length`` (default 1 × 1,024). Each process times its configuration beside
the plain forward pass (``model(tokens, return_type=None)``), interleaved, after a warm-up
of both: ``ratio`` = median of ``--repeats`` (3) wall times of the configuration / median of
the forward's; ``cpu_ratio`` the same from process CPU time (other jobs on a shared machine
disturb it far less than wall time); ``spread`` = (max − min) / median of the per-repeat
ratios. Peak memory, in the same process after the timing: resident set after the model is
loaded plus the peak growth of one call (``VmHWM`` reset before it), configuration / forward.

Targets (issue 32): ``all`` ≤ 1.5, every probe alone ≤ 1.25, peak memory of ``all`` ≤ 1.3.
Last line: one JSON object.
Usage: ``python benchmarks/real_model.py [--model smollm2-135m|gpt2-small] [--random]
[--length 1024] [--batch 1] [--repeats 3] [--configs all,stats,contributions,sinks,fields]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import peak_rss_growth_mib, proc_status_kib

HERE = Path(__file__).resolve().parent
CONFIGS = ("all", "stats", "contributions", "sinks", "fields")
PROBE_KEYS = ("stats", "contributions", "sinks", "fields")

#: SmolLM2-135M's shape (Hugging Face config of HuggingFaceTB/SmolLM2-135M).
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, hidden_act="silu", bos_token_id=0,
                    eos_token_id=0, pad_token_id=0)


def save_random_smollm(folder: Path) -> Path:
    """A random LlamaForCausalLM of SmolLM2-135M's shape (and a small tokenizer) in ``folder``."""
    import torch
    import transformers as tr

    sys.path.insert(0, str(HERE.parent / "tests"))
    from _tiny_hf import char_tokenizer

    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(tr.LlamaConfig(**SMOLLM2_135M))
    model.save_pretrained(folder)
    char_tokenizer(64).save_pretrained(folder)
    return folder


def load_model(kind: str, folder: str | None):
    """(model, description) for a child process."""
    import torch

    if kind == "gpt2-small":
        sys.path.insert(0, str(HERE))
        import real_size

        model, _ = real_size.build()
        return model, "gpt2-small-shaped random bridge (12L, 12H, d_model 768)"
    if folder is None:
        from tl_spectral.models import zoo

        model, _ = zoo.load("smollm2-135m")
        return model.eval(), "zoo smollm2-135m"
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_transformers(
        folder, device="cpu", dtype=torch.float32,
        hf_config_overrides={"attn_implementation": "eager"})
    return model.eval(), "random LlamaForCausalLM of SmolLM2-135M's shape (30L, 9/3 heads GQA)"


def make_probes(config: str) -> list:
    from tl_spectral.probes import (
        AttentionFieldProbe,
        AttentionStatsProbe,
        ContributionProbe,
        SinkProbe,
    )

    make = {"stats": AttentionStatsProbe, "contributions": ContributionProbe, "sinks": SinkProbe,
            "fields": AttentionFieldProbe}
    keys = PROBE_KEYS if config == "all" else (config,)
    return [make[k]() for k in keys]


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    from tl_spectral.probes import run_probes

    model, desc = load_model(args.model, args.folder)
    vocab = int(model.cfg.d_vocab)
    tokens = torch.randint(0, vocab, (args.batch, args.length),
                           generator=torch.Generator().manual_seed(1))

    def plain():
        with torch.no_grad():
            model(tokens, return_type=None)

    def probes():
        return run_probes(model, tokens, make_probes(args.config), batch_size=args.batch,
                          progress=False)

    plain()
    probes()  # warm-up of both
    wall: dict[str, list[float]] = {"plain": [], "probes": []}
    cpu: dict[str, list[float]] = {"plain": [], "probes": []}
    for _ in range(args.repeats):
        for k, f in (("plain", plain), ("probes", probes)):
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    per = [q / p for p, q in zip(wall["plain"], wall["probes"])]
    base = proc_status_kib("VmRSS")
    g_plain = peak_rss_growth_mib(plain)
    g_probes = peak_rss_growth_mib(probes)
    med = statistics.median
    print(json.dumps({
        "config": args.config, "model": desc, "T": args.length, "batch": args.batch,
        "ratio": med(wall["probes"]) / med(wall["plain"]),
        "cpu_ratio": med(cpu["probes"]) / med(cpu["plain"]),
        "spread": (max(per) - min(per)) / med(per),
        "plain_s": med(wall["plain"]), "probes_s": med(wall["probes"]),
        "plain_cpu_s": med(cpu["plain"]), "probes_cpu_s": med(cpu["probes"]),
        "mem_ratio": (base + g_probes * 1024) / (base + g_plain * 1024),
        "base_rss_mib": base / 1024, "plain_growth_mib": g_plain, "probes_growth_mib": g_probes,
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "gpt2-small"))
    ap.add_argument("--random", action="store_true",
                    help="a random model of SmolLM2-135M's shape even when the zoo has it")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = sorted(set(configs) - set(CONFIGS))
    if bad:
        raise SystemExit(f"unknown configurations {bad}; pick from {list(CONFIGS)}")
    with tempfile.TemporaryDirectory(prefix="real_model_") as tmp:
        folder = None
        if args.model == "smollm2-135m":
            use_zoo = False
            if not args.random:
                from tl_spectral.models import zoo

                use_zoo = "smollm2-135m" in zoo.available()
            if not use_zoo:
                folder = str(save_random_smollm(Path(tmp)))
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
        rows = {}
        for c in configs:
            cmd = [sys.executable, __file__, "--child", "--config", c, "--model", args.model,
                   "--length", str(args.length), "--batch", str(args.batch),
                   "--repeats", str(args.repeats)]
            if folder is not None:
                cmd += ["--folder", folder]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"configuration {c} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows[c] = r
            print(f"{c:>13}: forward {r['plain_s']:.2f} s, probes {r['probes_s']:.2f} s -> "
                  f"ratio {r['ratio']:.3f} (CPU {r['cpu_ratio']:.3f}, spread "
                  f"{r['spread']:.2f}), peak memory {r['mem_ratio']:.3f}", flush=True)
    first = next(iter(rows.values()))
    summary = {
        "benchmark": "real_model", "model": first["model"], "T": args.length,
        "batch": args.batch, "repeats": args.repeats, "threads": 1,
        **{f"{c}_ratio": round(r["ratio"], 3) for c, r in rows.items()},
        **{f"{c}_cpu_ratio": round(r["cpu_ratio"], 3) for c, r in rows.items()},
        **{f"{c}_spread": round(r["spread"], 3) for c, r in rows.items()},
        **{f"{c}_mem_ratio": round(r["mem_ratio"], 3) for c, r in rows.items()},
        "forward_s": {c: round(r["plain_s"], 3) for c, r in rows.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
