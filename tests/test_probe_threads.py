"""Issue 36 item 3: two threads running probes on one model.

The capture hooks live on the model, so concurrent passes on one model saw each other's
batches (a thread's probes counted 640 queries instead of 512) or lost their hooks. A second
concurrent run on a model is refused with a one-line ``RuntimeError``; runs on two models in
two threads stay correct. The overlap is forced with events inside a user hook, never with
timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import make_native

from tl_spectral.probes import AttentionStatsProbe, run_probes

_WAIT = 120  # a safety net only: the events decide the order


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(seed))


def _blocking_hook(inside: threading.Event, release: threading.Event):
    """A user hook that signals it is inside a pass, then waits to be released (once)."""
    def hook(t, hook=None):
        if not inside.is_set():
            inside.set()
            assert release.wait(_WAIT)
        return t

    return [("blocks.0.hook_resid_pre", hook)]


def test_a_second_thread_on_the_same_model_is_refused_and_the_first_run_is_right():
    model = make_native(n_layers=2, seed=11)
    tokens = _tokens(1)
    expected = run_probes(model, tokens, [AttentionStatsProbe()], progress=False)["attention_stats"]
    inside, release = threading.Event(), threading.Event()
    out: dict = {}

    def first():
        try:
            out["first"] = run_probes(model, tokens, [AttentionStatsProbe()], progress=False,
                                      fwd_hooks=_blocking_hook(inside, release))
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            out["first_error"] = exc

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(_WAIT)  # the first run is inside its forward pass
    errors: dict = {}

    def second():
        try:
            run_probes(model, _tokens(2), [AttentionStatsProbe()], progress=False)
        except RuntimeError as exc:
            errors["second"] = exc

    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(_WAIT)
    release.set()
    t.join(_WAIT)
    assert "first_error" not in out, out.get("first_error")
    message = str(errors["second"])
    assert "\n" not in message and "sequential" in message and "one model per thread" in message
    got = out["first"]["attention_stats"]
    np.testing.assert_allclose(got.entropy, expected.entropy, atol=1e-6)
    # the model is free again, in any thread
    again = run_probes(model, tokens, [AttentionStatsProbe()], progress=False)["attention_stats"]
    np.testing.assert_allclose(again.entropy, expected.entropy, atol=1e-6)


def test_two_threads_on_two_models_run_at_once_and_stay_right():
    models = [make_native(n_layers=2, seed=s) for s in (12, 13)]
    toks = [_tokens(3), _tokens(4)]
    expected = [run_probes(m, x, [AttentionStatsProbe()], progress=False)["attention_stats"]
                for m, x in zip(models, toks)]
    both_inside = threading.Barrier(2, timeout=_WAIT)
    out: dict = {}

    def run(i):
        done = []

        def hook(t, hook=None):
            if not done:
                done.append(1)
                both_inside.wait()  # both passes are in flight together
            return t

        try:
            out[i] = run_probes(models[i], toks[i], [AttentionStatsProbe()], progress=False,
                                fwd_hooks=[("blocks.0.hook_resid_pre", hook)])["attention_stats"]
        except BaseException as exc:  # noqa: BLE001
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_WAIT)
    for i in range(2):
        assert not isinstance(out[i], BaseException), out[i]
        np.testing.assert_allclose(out[i].entropy, expected[i].entropy, atol=1e-6)


def test_the_same_thread_may_run_again_from_on_logits():
    model = make_native(n_layers=2, seed=14)
    tokens = _tokens(5)
    inner = []
    run_probes(model, tokens, [AttentionStatsProbe()], progress=False, batch_size=4,
               on_logits=lambda start, lg: inner.append(
                   run_probes(model, tokens, [AttentionStatsProbe()], progress=False)))
    assert len(inner) == 1
    with pytest.raises(KeyError):  # nothing is left holding the model
        from tl_spectral.probes.runner import _RUNNING
        _RUNNING[id(model)]
