"""Every function that takes tokens accepts DocumentWindows, a tensor, or lists of ids."""

from __future__ import annotations

import pytest
import torch

from tl_spectral.data import document_windows
from tl_spectral.data.inputs import as_token_tensor
from tl_spectral.interventions.ablations import ablate, ablation_table
from tl_spectral.interventions.surgery import linearization_curve, perplexity
from tl_spectral.models import GPT, GPTConfig


class _Tok:
    def encode(self, text):
        return [ord(c) % 17 for c in text]


def _gpt(attention="softmax"):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=17, n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16,
                         d_mlp=32, attention=attention)).eval()


def _windows():
    return document_windows("the quick brown fox jumps over the lazy dog " * 20, _Tok(), 4, 9,
                            seed=0)


def test_as_token_tensor_forms():
    w = _windows()
    t = as_token_tensor(w)
    assert t.shape == (4, 9) and t.dtype == torch.long
    assert torch.equal(as_token_tensor(t.tolist()), t)
    assert torch.equal(as_token_tensor(t[0].tolist()), t[:1])
    with pytest.raises(TypeError, match="document_windows"):
        as_token_tensor("some text")
    with pytest.raises(TypeError, match="integer"):
        as_token_tensor(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="different lengths"):
        as_token_tensor([[1, 2], [3]])


def test_ablation_table_and_curves_take_document_windows():
    w = _windows()
    m = _gpt()
    a = ablation_table(m, w, per_layer=False)
    b = ablation_table(m, w.tokens, per_layer=False)
    assert a.rows == b.rows
    assert perplexity(m, w) == perplexity(m, w.tokens.tolist())
    c = linearization_curve(m, w, ks=[0, 1])
    d = linearization_curve(m, w.tokens, ks=[0, 1])
    assert c.ppl_zero_shot == d.ppl_zero_shot and c.base_ppl == d.base_ppl


def test_ablate_names_what_applies():
    with pytest.raises(ValueError, match="has none.*symmetric_removal"):
        ablate(_gpt("softmax"), "filtering_collapse")


def test_load_text_names_the_file_and_byte_offset(tmp_path):
    from tl_spectral.data import load_text

    p = tmp_path / "latin1.txt"
    p.write_bytes(b"abc caf\xe9 au lait")
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8.*byte 0xe9 at byte offset 7"):
        load_text(p)
