"""Train the GPT-2 of train_gpt2.py, patched with fusedops, data-parallel under torch DDP (or FSDP2 with
--fsdp), and check it against a single-process run on the same global batches.

    torchrun --nproc_per_node 2 examples/train_ddp.py --steps 50                   # 2 GPUs, NCCL, DDP
    torchrun --nproc_per_node 2 examples/train_ddp.py --steps 50 --fsdp            # FSDP2 (fully_shard)
    torchrun --nproc_per_node 2 examples/train_ddp.py --device cpu --backend gloo --steps 3

Every step draws one global batch (world_size * --batch-size sequences, the same on every rank);
rank r trains on its slice. Rank 0 also trains a reference copy of the model, built from the same
seed, on the whole global batch in one process (no collectives), with the same optimizer and
gradient clipping. Since the per-rank losses are means over equally many tokens, the averaged
gradient of the data-parallel run is the gradient of the reference's loss: the two loss curves
agree up to floating-point reduction order (bf16 autocast on CUDA makes that visible in the third
or fourth digit), which a hard batch can amplify later in the run. Measured on two H200s: DDP stays
within 5e-2 of the reference over 50 steps; FSDP2 (30 steps) has a one-step excursion of 0.4 to 2
around step 7 or 8 and differences of about 0.1 after it, and so does the plain model (--no-patch):
they come from FSDP2's reduction order, not from fusedops. Rank 0 prints both curves side by side,
the largest loss difference and the largest parameter difference at the end; --tolerance makes a
larger loss difference an error (exit status 1).

NCCL_NVLS_ENABLE defaults to 0 (NVLink multicast off), which the H200 host requires.
"""

from __future__ import annotations

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from typing import List, Optional  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# FSDP2 warns that GPT2LMHeadModel returns a view (the loss); this script does no in-place op on it.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as common  # noqa: E402


def shard(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """The model wrapped for data parallelism: DDP, or FSDP2 (fully_shard on each transformer block,
    then on the whole model) with --fsdp."""
    if not args.fsdp:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise SystemExit(f"--fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this is torch "
                         f"{torch.__version__}") from None
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def full_parameters(model: torch.nn.Module) -> List[torch.Tensor]:
    """Every parameter as a full local tensor (FSDP2's sharded DTensors are gathered: a collective)."""
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]


def step(model, optimizer, schedule, ids: torch.Tensor, device: torch.device, args) -> torch.Tensor:
    with common.autocast(device, args.autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # as train_gpt2.py (FSDP2: over all shards)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_model_arguments(parser)
    parser.set_defaults(steps=50)
    parser.add_argument("--backend", default=None, help="nccl or gloo (default: nccl on CUDA, gloo on the CPU)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--no-patch", dest="patch", action="store_false",
                        help="train the plain transformers model (both runs): separates fusedops from the wrapper")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the single-process reference run on rank 0")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="exit with status 1 when a step's losses differ by more than this")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes the losses as JSON")
    args = common.resolve_arguments(parser.parse_args(argv))
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun, e.g. torchrun --nproc_per_node 2 examples/train_ddp.py")

    rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend=args.backend or ("nccl" if device.type == "cuda" else "gloo"),
                            device_id=device if device.type == "cuda" else None)
    try:
        return _train(args, rank, world, device)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> int:
    tokens = common.load_corpus(int(args.corpus_mb * 2**20))
    # The same initial weights on every rank and in the reference (DDP also broadcasts rank 0's).
    model, report = common.build_model(args, patched=args.patch, seed=args.seed)
    model = shard(model.to(device).train(), args, device)
    optimizer, schedule = common.make_optimizer(model, args)
    reference = None
    if rank == 0 and args.reference:
        reference, _ = common.build_model(args, patched=args.patch, seed=args.seed)
        reference.to(device).train()
        reference_optimizer, reference_schedule = common.make_optimizer(reference, args)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"{world} ranks ({'FSDP2' if args.fsdp else 'DDP'}, {dist.get_backend()}) on {name}; global batch "
              f"{world} x {args.batch_size} x {args.seq_len} tokens; {args.layers} layers, width {args.width}\n"
              f"{report if report is not None else 'not patched (--no-patch)'}", flush=True)
    batches = common.Batches(tokens, args.seq_len, world * args.batch_size, args.seed + 1)
    parallel_losses, reference_losses = [], []
    for _ in range(args.steps):
        ids = batches.next().to(device)
        local = ids[rank * args.batch_size:(rank + 1) * args.batch_size]
        loss = step(model, optimizer, schedule, local, device, args)
        dist.all_reduce(loss)       # SUM (gloo has no AVG): the mean of equal-sized rank means
        parallel_losses.append(loss / world)
        if reference is not None:
            reference_losses.append(step(reference, reference_optimizer, reference_schedule, ids, device, args))
    parameters = full_parameters(model)     # every rank takes part in FSDP2's gathers
    if rank != 0:
        return 0
    parallel = [float(x) for x in parallel_losses]
    print(f"{'step':>6}{'loss ' + ('FSDP2' if args.fsdp else 'DDP'):>14}", end="")
    if reference is None:
        print("\n" + "\n".join(f"{i:>6}{x:>14.5f}" for i, x in enumerate(parallel)))
        return 0
    single = [float(x) for x in reference_losses]
    print(f"{'loss 1 process':>16}{'|diff|':>12}")
    for i, (a, b) in enumerate(zip(parallel, single)):
        print(f"{i:>6}{a:>14.5f}{b:>16.5f}{abs(a - b):>12.2e}")
    max_loss_difference = max(abs(a - b) for a, b in zip(parallel, single))
    max_parameter_difference = max((p.float() - q.detach().float()).abs().max().item()
                                   for p, q in zip(parameters, reference.parameters()))
    print(f"max |loss difference| over {args.steps} steps: {max_loss_difference:.3e}\n"
          f"max |parameter difference| after the last step: {max_parameter_difference:.3e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": world, "fsdp": args.fsdp, "arguments": vars(args), "parallel_losses": parallel,
                       "single_process_losses": single, "max_loss_difference": max_loss_difference,
                       "max_parameter_difference": max_parameter_difference}, f, indent=1)
    if args.tolerance is not None and max_loss_difference > args.tolerance:
        print(f"FAILED: the losses differ by more than --tolerance {args.tolerance}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
