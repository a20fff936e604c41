# %% [markdown]
# # tl_spectral quickstart
#
# Load a model, run probes inside one forward pass, plot, save.
# Opens as a notebook in VS Code / Jupytext (cells are marked `# %%`); runs as a script.

# %%
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib

matplotlib.use("Agg")

import torch

from tl_spectral.data import document_windows, tiny_shakespeare
from tl_spectral.model_view import ModelView
from tl_spectral.probes import AttentionStatsProbe, run_probes
from tl_spectral.results import Result

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "quickstart_out")
OUT.mkdir(parents=True, exist_ok=True)
N_DOCS = int(os.environ.get("QUICKSTART_N_DOCS", "32"))

# %% Load a model: the shipped char-level Shakespeare model when available
try:
    from tl_spectral import zoo

    model, tokenizer = zoo.load("char-shakespeare")
except Exception as exc:  # the zoo is optional in a stripped install
    print(f"(zoo unavailable: {exc}; using a seeded random model)")
    from tl_spectral import load_model

    model, tokenizer = load_model("random")
view = ModelView(model)
print(view)

# %% An ensemble of document windows: N windows of exactly T tokens
text = tiny_shakespeare()
windows = document_windows(text, tokenizer, n_docs=N_DOCS, length=128, seed=0)
print(windows.tokens.shape)

# %% Run probes: one forward pass per batch, no activation cache
results = run_probes(model, windows, [AttentionStatsProbe()], batch_size=8, progress=True)
stats = results["attention_stats"]
for row in stats.to_rows()[:4]:
    print(row)

# %% Plot
fig = stats.plot()
fig.savefig(OUT / "attention_stats.png", dpi=100)

# %% Save and load back
path = stats.save(OUT / "attention_stats.safetensors", overwrite=True)  # rerunnable
again = Result.load(path)
assert torch.equal(again.entropy, stats.entropy)
print("saved to", path)
