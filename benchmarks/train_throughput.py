"""Training throughput: our Trainer vs a plain loop over a same-size TransformerLens model.

Both train the char-shakespeare configuration (6 layers, 8 heads, d_model 128, d_mlp 512,
context 256, vocabulary 78) on windows of the bundled Tiny Shakespeare, with AdamW and
gradient clipping, in the same process: rounds of ``--steps`` steps alternate between the
two so that any load on the machine hits both alike. Reported: tokens/s of each (median
over rounds) and their ratio (ours / TransformerLens); the last line is the JSON.

The baseline is ``TransformerBridge.boot_native`` (TransformerLens' own native model with
the same shapes) trained by the loop everyone writes: forward, cross-entropy, backward,
clip, AdamW step.

    python benchmarks/train_throughput.py [--batch 8] [--steps 4] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4, help="steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import transformer_lens.model_bridge.sources.native  # noqa: F401
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from tl_spectral.data import CharTokenizer, tiny_shakespeare, train_val_split
    from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer

    text = tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    train_text, val_text = train_val_split(text)
    train_ids = torch.tensor(tok.encode(train_text))
    val_ids = torch.tensor(tok.encode(val_text[:5000]))
    n_ctx, B = 256, args.batch

    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layers=6, n_heads=8, d_model=128,
                         d_head=16, n_ctx=n_ctx, d_mlp=512, normalization="ln"))
    trainer = Trainer(ours, train_ids, val_ids, TrainConfig(
        steps=100_000, batch_size=B, lr=1e-3, warmup_steps=10, eval_every=100_000,
        checkpoint_every=100_000, progress=False, device=args.device))

    tl_cfg = TransformerBridgeConfig(
        d_model=128, d_head=16, n_layers=6, n_ctx=n_ctx, n_heads=8, d_vocab=tok.vocab_size,
        d_mlp=512, act_fn="gelu", normalization_type="LN", attention_dir="causal",
        positional_embedding_type="standard", seed=0)
    tl_model = TransformerBridge.boot_native(tl_cfg, device=args.device)
    tl_model.train()
    n_ours = sum(p.numel() for p in ours.parameters())
    n_tl = sum(p.numel() for p in tl_model.parameters())
    opt = torch.optim.AdamW(tl_model.parameters(), lr=1e-3, weight_decay=0.1,
                            betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(0)

    def tl_steps(n: int) -> None:
        for _ in range(n):
            starts = torch.randint(0, train_ids.numel() - n_ctx - 1, (B,), generator=g)
            batch = train_ids[starts[:, None] + torch.arange(n_ctx + 1)].to(args.device)
            logits = tl_model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tl_model.parameters(), 1.0)
            opt.step()

    def ours_steps(n: int) -> None:
        trainer.fit(stop_at=trainer.step + n)

    def timed(fn, n: int) -> float:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(n)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return B * n_ctx * n / (time.perf_counter() - t0)

    timed(ours_steps, 1)  # warm-up
    timed(tl_steps, 1)
    ours_tps, tl_tps = [], []
    for r in range(args.rounds):
        order = [(ours_steps, ours_tps), (tl_steps, tl_tps)]
        for fn, acc in (order if r % 2 == 0 else order[::-1]):
            acc.append(timed(fn, args.steps))
    o, t = statistics.median(ours_tps), statistics.median(tl_tps)
    print(f"params: ours {n_ours}, TransformerLens {n_tl}")
    print(f"tokens/s per round: ours {[round(x) for x in ours_tps]}, "
          f"TransformerLens {[round(x) for x in tl_tps]}")
    print(json.dumps({"throughput_ratio": round(o / t, 3), "ours_tokens_per_s": round(o, 1),
                      "tl_tokens_per_s": round(t, 1), "batch": B, "n_ctx": n_ctx,
                      "threads": args.threads, "device": args.device}))


if __name__ == "__main__":
    main()
