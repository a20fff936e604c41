"""Under torch.distributed (2 gloo processes) each rank runs its shard; states are reduced."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import make_native

from tl_spectral.probes import AttentionFieldProbe, AttentionStatsProbe, run_probes
from tl_spectral.results import Result


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _spawn2(fn, tmp_path, port=None) -> None:
    """Two gloo processes. A process killed by a signal (gloo's TCP store aborting on a
    loaded 2-core machine: "terminate called without an active exception") is retried twice
    on a fresh port, into an emptied ``tmp_path`` (the killed attempt may have saved some
    results already, and saving never overwrites); an exception raised inside a worker (a
    failed check) is not retried."""
    for attempt in range(3):
        if attempt:
            for p in Path(tmp_path).iterdir():
                p.unlink()
        try:
            mp.spawn(fn, args=(2, port if port and attempt == 0 else _free_port(),
                               str(tmp_path)), nprocs=2, join=True)
            return
        except mp.ProcessExitedException:
            if attempt == 2:
                raise


def _corpus():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 50, (n,), generator=g) for n in (9, 4, 12, 7, 11)]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = make_native(seed=11)
        res = run_probes(model, _corpus(), [AttentionStatsProbe(), AttentionFieldProbe()], batch_size=2,
                         progress=False)
        res["attention_stats"].save(os.path.join(out_dir, f"rank{rank}.safetensors"))
        res["attention_fields"].save(os.path.join(out_dir, f"fields{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


@pytest.mark.tl39
def test_two_gloo_processes_equal_one(tmp_path):
    port = _free_port()
    _spawn2(_worker, tmp_path, port)
    both = run_probes(make_native(seed=11), _corpus(), [AttentionStatsProbe(), AttentionFieldProbe()],
                      batch_size=2, progress=False)
    single, fields = both["attention_stats"], both["attention_fields"]
    for rank in range(2):
        r = Result.load(tmp_path / f"rank{rank}.safetensors")
        assert torch.equal(r.n_queries, single.n_queries)
        for f in ("entropy", "distance", "first_token_mass", "mean_pattern"):
            torch.testing.assert_close(getattr(r, f), getattr(single, f), atol=1e-6, rtol=1e-6)
        fr = Result.load(tmp_path / f"fields{rank}.safetensors")
        assert torch.equal(fr.doc_mask, fields.doc_mask)  # documents in corpus order
        for layer in fields.layers:
            torch.testing.assert_close(fr.fields[str(layer)], fields.fields[str(layer)],
                                       atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(fr.mean[str(layer)], fields.mean[str(layer)],
                                       atol=1e-6, rtol=1e-6)


def _cat_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from tl_spectral.probes.base import Probe, reduce_state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        class P(Probe):
            name = "p"
            reductions = {"rows": "cat", "peak": "max"}

        p = P()
        # rank 0: 2 rows of width 3; rank 1: 3 rows of width 5 (shapes differ, cat pads)
        n, w = (2, 3) if rank == 0 else (3, 5)
        p.accumulate("rows", torch.full((n, w), float(rank + 1)))
        p.accumulate("peak", torch.tensor([float(rank), 10.0 - rank]))
        p.accumulate("total", torch.tensor([1.0 + rank]))
        reduce_state(p)
        torch.save({k: v for k, v in p.state.items()}, os.path.join(out_dir, f"s{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_reduce_cat_max_sum(tmp_path):
    _spawn2(_cat_worker, tmp_path)
    for rank in range(2):
        s = torch.load(tmp_path / f"s{rank}.pt", weights_only=True)
        assert s["rows"].shape == (5, 5)
        assert torch.equal(s["rows"][:2, :3], torch.ones(2, 3))
        assert torch.equal(s["rows"][:2, 3:], torch.zeros(2, 2))
        assert torch.equal(s["rows"][2:], torch.full((3, 5), 2.0))
        assert s["peak"].tolist() == [1.0, 10.0]
        assert s["total"].tolist() == [3.0]


def _one_rank_cat_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import datetime

    import torch.distributed as dist

    from tl_spectral.probes.base import Probe, reduce_state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        class P(Probe):
            name = "p"

        p = P()
        if rank == 0:  # as ContributionProbe's kept maps: declared where the rows are
            p.reductions = {"kept": "cat"}
            p.accumulate("kept", torch.arange(6.0).reshape(2, 3))
        p.accumulate("total", torch.tensor([1.0 + rank]))
        reduce_state(p)
        torch.save({k: v for k, v in p.state.items()}, os.path.join(out_dir, f"s{rank}.pt"))
        assert p.reductions == {"kept": "cat"} and P.reductions == {}
    finally:
        dist.destroy_process_group()


def test_reduce_a_cat_state_declared_on_one_rank_only(tmp_path):
    """A state one rank alone holds and declares "cat" (a document kept by its shard) is
    gathered on every rank — before, the other rank summed it and the two waited on
    different collectives (torchrun analyze with every section hung)."""
    _spawn2(_one_rank_cat_worker, tmp_path)
    for rank in range(2):
        s = torch.load(tmp_path / f"s{rank}.pt", weights_only=True)
        assert torch.equal(s["kept"], torch.arange(6.0).reshape(2, 3))
        assert s["total"].tolist() == [3.0]


def _ragged_corpus():
    g = torch.Generator().manual_seed(13)
    return [torch.randint(0, 50, (n,), generator=g) for n in (40, 5, 23, 3, 17, 31, 2, 12, 28, 9, 36)]


def _contrib_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from tl_spectral.probes.contributions import ContributionProbe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        res = run_probes(make_native(n_layers=2, seed=11), _ragged_corpus(),
                         [ContributionProbe(rank_stride=2, rank_per_head=True)], batch_size=3,
                         progress=False)["contributions"]
        res.save(os.path.join(out_dir, f"contrib{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def test_contribution_statistics_two_processes_equal_one(tmp_path):
    # ragged documents: each process pads its batches to other lengths than one process
    # does; the sampled rank queries follow each document's own length, so the Spearman
    # statistics (and every other field) agree to float32 round-off
    from tl_spectral.probes.contributions import ContributionProbe

    _spawn2(_contrib_worker, tmp_path)
    single = run_probes(make_native(n_layers=2, seed=11), _ragged_corpus(),
                        [ContributionProbe(rank_stride=2, rank_per_head=True)], batch_size=11,
                        progress=False)["contributions"]
    for rank in range(2):
        r = Result.load(tmp_path / f"contrib{rank}.safetensors")
        for f in ("rank_corr", "rank_rows", "negative_fraction", "negative_fraction_raw",
                  "negative_mass", "source_mean", "source_count", "lag_mean", "lag_count"):
            torch.testing.assert_close(getattr(r, f), getattr(single, f), atol=1e-6, rtol=1e-5,
                                       msg=f)
