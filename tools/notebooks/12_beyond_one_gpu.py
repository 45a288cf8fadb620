# %% [markdown]
# # 12 · Beyond one GPU: memory per rank under DDP, ZeRO and FSDP
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# Lessons 10 and 11 counted what one training step holds on one card: weights, gradients,
# optimizer state and activations. When a model outgrows one card, the next questions are still
# memory questions: how much does each GPU hold when the job runs on several? This lesson runs
# the strategies people use, on `torch.distributed` itself, not on a simulation of it:
#
# 1. **DDP** (`DistributedDataParallel`) keeps a full copy of everything on every rank;
# 2. **ZeRO** shards what DDP replicates: stage 1 the optimizer state
#    (`torch.distributed.optim.ZeroRedundancyOptimizer`), stage 2 the gradients too, stage 3 the
#    parameters too, which is what **FSDP2** (`torch.distributed.fsdp.fully_shard`) does;
# 3. what each costs in **communication**, counted from the collectives of one step;
# 4. the estimate for a 7B fine-tune on 8 × H100;
# 5. the other way a job grows past one process: **DataLoader workers**, and their host memory.
#
# There is no GPU here, so the ranks are processes on this CPU, talking through
# `torch.distributed`'s gloo backend, and each rank's device is a virtual GPU that counts every
# tensor it allocates. The wrappers, their buckets, shards and gathers are torch's own. What the
# CPU cannot show: NCCL's buffers, CUDA streams (FSDP2 overlaps its gathers with compute on a GPU
# and may hold one more unit at once), and the wire's speed. No GPU run has checked these figures
# yet (`docs/gpu-runs/`).

# %%
import functools
import warnings

import matplotlib.pyplot as plt
import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import N_, tr
from vramlab.lessons import models
from vramlab.lessons.multigpu import communication_per_step_many, ring_bytes_sent
from vramlab.lessons.predict import guess
from vramlab.sim import measure_distributed_many
from vramlab.sim.presets import get_preset

warnings.filterwarnings("ignore", message="DTensor random operators")  # FSDP2 on a CPU mesh says so once per rank
torch.manual_seed(0)
MiB, GiB = 2**20, 2**30
# the model of lessons 10 and 11, tiny: a GPT of 5.3 M parameters, sequences of 64 tokens, 4 per rank
gpt = functools.partial(models.make_gpt, "tiny", seq=64)
build, make_batch, loss_fn = gpt()
n_params = sum(p.numel() for p in build().parameters())
batch_per_rank = 4
print(tr("GPT: {n:,} parameters ({size} in fp32); batch {b} x 64 tokens per rank", n=n_params,
         size=format_bytes(4 * n_params), b=batch_per_rank))

# %% [markdown]
# ## 1. DDP: what each rank holds
#
# Under DDP each rank runs the same model on its own slice of the batch. After backward, DDP
# averages the gradients across ranks (an all-reduce), bucket by bucket, into flat buffers of
# 25 MiB that it keeps from step to step.
#
# **Predict.** Going from 2 ranks to 4, what happens to the peak of each rank: halves, stays,
# doubles?

# %%
prediction_ddp_4_over_2 = None  # your guess: rank peak at 4 ranks / at 2 ranks

# %%
strategies = ("ddp", "zero1", "zero2", "fsdp")
runs = [dict(factory=gpt, strategy=s, batch_size=batch_per_rank, optimizer="adam") for s in strategies]
measured = {}
for n in (2, 4):
    for s, ranks in zip(strategies, measure_distributed_many(runs, world_size=n)):
        measured[s, n] = ranks
one = vramlab.estimate(build, make_batch, batch_size=batch_per_rank, optimizer="adam", loss_fn=loss_fn)
ddp2, ddp4 = (max(r.peak for r in measured["ddp", n]) for n in (2, 4))
print(tr("one process, no DDP (estimate): peak {peak}", peak=format_bytes(one.peak)))
for n in (2, 4):
    print(tr("DDP on {n} ranks, measured: ", n=n) + ", ".join(format_bytes(r.peak) for r in measured["ddp", n]))
print(tr("4 ranks against 2: x{ratio:.2f} ({guess}); ", ratio=ddp4 / ddp2, guess=guess(prediction_ddp_4_over_2, "x{}"))
      + tr("DDP adds {size} to a rank over one process: the gradient buckets", size=format_bytes(ddp2 - one.peak)))

# %% [markdown]
# Each rank's memory does not depend on how many ranks there are: every rank holds the whole
# model, its gradients and the whole optimizer state. DDP buys speed (more samples per step), not
# memory. It even costs memory: the flat buckets hold a second copy of the gradients
# (`gradient_as_bucket_view=True` makes the gradients views into them and saves that copy).

# %%
assert ddp4 == ddp2, (ddp2, ddp4)  # the rank's memory does not depend on the number of ranks
assert len({r.peak for r in measured["ddp", 4]}) == 1  # and every rank holds the same
assert ddp2 > one.peak  # the buckets come on top of a single process's step

# %% [markdown]
# ## 2. ZeRO and FSDP shard what DDP replicates
#
# ZeRO (the "zero redundancy optimizer") removes the copies that DDP keeps on every rank, in
# three stages. Stage 1 gives each rank the optimizer state of its share of the parameters (torch's
# `ZeroRedundancyOptimizer`, with DDP); after the update each rank broadcasts its share of the new
# weights. Stage 2 also keeps only the gradients of its share: torch has no stage 2 of its own, so
# vramlab builds one from DDP's pieces (each gradient reduced to the rank that owns it, then
# dropped elsewhere), and it is measured like the others. Stage 3 shards the parameters themselves,
# which is FSDP2: every unit (here, each transformer block) is gathered whole just before it runs,
# and freed after.
#
# `vramlab.estimate(..., world_size=N, strategy=...)` predicts a rank's peak without the ranks: it
# runs the same wrappers on torch's fake process group, on fake tensors.
#
# **Predict.** At 4 ranks, which strategy gives the lowest peak per rank? And how far does FSDP
# fall below DDP: to a half, a quarter, less?

# %%
prediction_lowest = None  # your guess: "ddp", "zero1", "zero2" or "fsdp"
prediction_fsdp_over_ddp = None  # your guess: FSDP's rank peak / DDP's, at 4 ranks

# %%
estimated = {(s, n): vramlab.estimate(build, make_batch, batch_size=batch_per_rank, optimizer="adam", loss_fn=loss_fn,
                                      world_size=n, strategy=s) for s in strategies for n in (2, 4)}
ws, wm = max(8, len(tr("strategy"))), max(26, len(tr("measured (busiest rank)")) + 2)  # wide enough for the words
print(f"{tr('strategy'):<{ws}}{tr('ranks'):>6}{tr('measured (busiest rank)'):>{wm}}{tr('estimate'):>12}{tr('error'):>8}"
      f"{tr('of DDP'):>8}")
errors = {}
for s in strategies:
    for n in (2, 4):
        m = max(r.peak for r in measured[s, n])
        e = estimated[s, n].peak
        errors[s, n] = e / m - 1
        print(f"{s:<{ws}}{n:>6}{format_bytes(m):>{wm}}{format_bytes(e):>12}{100 * errors[s, n]:>+7.1f}%"
              f"{m / max(r.peak for r in measured['ddp', n]):>8.2f}")
peak4 = {s: max(r.peak for r in measured[s, 4]) for s in strategies}
lowest = min(peak4, key=peak4.get)
print(tr("lowest at 4 ranks: {lowest} ({guess}); ", lowest=lowest, guess=guess(prediction_lowest, answer=lowest))
      + tr("FSDP / DDP = {ratio:.2f} ({guess})", ratio=peak4["fsdp"] / peak4["ddp"], guess=guess(prediction_fsdp_over_ddp)))

fig, ax = plt.subplots(figsize=(6, 2.8))
for i, n in enumerate((2, 4)):
    ax.bar([j + 0.4 * i for j in range(len(strategies))], [max(r.peak for r in measured[s, n]) / MiB for s in strategies],
           width=0.4, label=tr("{n} ranks", n=n))
ax.set_xticks([j + 0.2 for j in range(len(strategies))], strategies)
ax.set_ylabel(tr("peak per rank (MiB)"))
ax.set_title(tr("measured on real ranks, by strategy"))
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Each stage takes a part of the fixed cost and divides it by the number of ranks, so the saving
# grows with the ranks, while the activations (each rank's own batch) stay whole. ZeRO-1 divides
# the optimizer state, the largest part under Adam (8 bytes per parameter of 16). Its shares are
# whole tensors, given out largest first, so one rank may hold more than its fair share: the table
# shows the busiest rank, which is the one that runs out of memory first. FSDP divides everything
# but the activations and the one unit being computed. The estimate agrees with the ranks to the
# percent printed: it counts the very allocations of the wrappers, not a formula.

# %%
assert all(abs(err) <= 0.03 for err in errors.values()), errors  # the estimate, within 3% of every measured peak
for n in (2, 4):
    p = {s: max(r.peak for r in measured[s, n]) for s in strategies}
    assert p["ddp"] > p["zero1"] > p["zero2"] > p["fsdp"], p  # each stage holds less
assert peak4["fsdp"] < max(r.peak for r in measured["fsdp", 2])  # and more ranks hold less each

# %% [markdown]
# ## 3. What the saved memory costs: communication
#
# Every strategy sends data at every step: what one rank no longer keeps, it must fetch.
# `lessons.multigpu.communication_per_step_many` counts the bytes
# of every collective of one step on real ranks: DDP's all-reduce of the gradients; ZeRO-1's
# all-reduce and the broadcast of the updated weights; FSDP's all-gathers of each unit's weights,
# before forward and again before backward, and the reduce-scatter of the gradients.
#
# **Predict.** With 2 ranks, how many times DDP's bytes does FSDP send?

# %%
prediction_fsdp_traffic = None  # your guess: FSDP's bytes sent / DDP's

# %%
comm = communication_per_step_many(gpt, world_size=2, batch_size=batch_per_rank)
param_bytes = comm["ddp"][0].parameter_bytes
sent = {s: sum(ring_bytes_sent(c.payload, 2) for c in counts) / len(counts) for s, counts in comm.items()}
print(tr("parameters: {size}; per step, 2 ranks (rank 0's collectives; sent: the ranks' mean):",
         size=format_bytes(param_bytes)))
for s, counts in comm.items():
    c = counts[0]
    kinds = ", ".join(tr("{kind} {size} ({calls} calls)", kind=k, size=format_bytes(v), calls=c.calls[k])
                      for k, v in c.payload.items())
    print(f"  {s:<6} {kinds}; " + tr("sent under the ring algorithm: {sent} (x{ratio:.2f} DDP's)",
                                     sent=format_bytes(sent[s]), ratio=sent[s] / sent["ddp"]))
print(f"FSDP / DDP: x{sent['fsdp'] / sent['ddp']:.2f} ({guess(prediction_fsdp_traffic, 'x{}')})")

# %% [markdown]
# The counts are those of the collectives torch called. The ring algorithm's arithmetic turns
# them into bytes sent: an all-reduce of `S` bytes sends `2 (N-1)/N · S`, an all-gather or a
# reduce-scatter `(N-1)/N · S`, a broadcast `S` from its root and from every receiver that passes it
# on down the chain, nothing from the last receiver. So DDP sends the gradients' bytes once at 2
# ranks (nearly twice at many). In the ZeRO paper, stages 1 and 2 send what DDP sends (a
# reduce-scatter of the gradients and an all-gather of the updated weights move what one all-reduce
# moves). torch's `ZeroRedundancyOptimizer` is built differently: it keeps DDP's all-reduce and then
# broadcasts each rank's updated partition from its owner; at 2 ranks each rank sends its own half
# and receives the other's, 1.5 times DDP's bytes on average. FSDP gathers each unit's weights
# before forward and again before backward, and reduce-scatters the gradients: 1.5 times DDP's
# bytes when every weight sits in a unit that is freed after forward. FSDP2 keeps the root's own
# weights (here the embedding and the last layers, outside the blocks) from forward to backward,
# since backward starts with them, so they are gathered once, and the measured ratio above is
# lower. Either way the memory saved is paid in bandwidth, which is why FSDP wants fast links
# (NVLink within a node) and overlaps its gathers with compute. (On GPUs NCCL may choose other
# algorithms for some sizes; these are the ring's figures.)

# %%
assert comm["ddp"][0].payload == {"all_reduce": param_bytes}  # every gradient, all-reduced once
gathered = comm["fsdp"][0].payload["all_gather"]
assert param_bytes < gathered < 2 * param_bytes  # the blocks' weights twice, the root's once
assert 1.0 < sent["fsdp"] / sent["ddp"] <= 1.5, sent  # more than DDP, at most 1.5 times
zero1_roots = sum(c.payload.get("broadcast_root", 0) for c in comm["zero1"])
assert abs(zero1_roots / param_bytes - 1) < 0.01  # torch's ZeRO-1: every updated weight, sent once by its owner
assert abs(sent["zero1"] / sent["ddp"] - 1.5) < 0.01  # DDP's all-reduce plus half the weights per rank

# %% [markdown]
# ## 4. A 7B fine-tune on 8 × H100
#
# Lesson 11's 7B model did not fit one 80 GB card with AdamW. Here it trains as most people
# train it, in bf16 mixed precision (`precision="bf16-mixed"`, Lightning's name): 16-bit compute
# with fp32 master weights and fp32 Adam moments, which is 16 bytes per parameter of model states
# (2 + 2 + 12, the ZeRO paper's count). Each strategy runs it the way its framework does: DDP under
# autocast, ZeRO-1/2 with 16-bit working weights and an fp32 master copy of the rank's partition,
# FSDP with fp32 shards gathered in bf16. On eight H100 80GB cards, one sequence of 512 tokens per
# rank, the estimate gives each strategy's rank peak and the model states a rank holds when the
# optimizer step ends; what PyTorch's caching allocator reserves at the peak (`Estimate.needed`,
# as in lesson 11) is set against what an H100 offers tensors (`GPUPreset.usable`).
#
# **Predict.** Which strategies fit?

# %%
prediction_fit_8xh100 = None  # your guess: a list of strategy names

# %%
build_7b, batch_7b, loss_7b = models.make_gpt("7B", seq=512)  # lesson 11's model
h100 = get_preset("H100-80GB")
seven = {s: vramlab.estimate(build_7b, batch_7b, batch_size=1, optimizer="adam", loss_fn=loss_7b, world_size=8,
                             strategy=s, precision="bf16-mixed", device="H100-80GB") for s in strategies}
psi, n_ranks = seven["ddp"].parameters, 8
paper = {"ddp": 16 * psi, "zero1": 4 * psi + 12 * psi / n_ranks, "zero2": 2 * psi + 14 * psi / n_ranks,
         "fsdp": 16 * psi / n_ranks}  # the ZeRO paper's model states per rank (Rajbhandari et al. 2020, Fig. 1)
print(tr("{n:.2f} B parameters, bf16-mixed, 8 ranks; model states when the optimizer step ends:", n=psi / 1e9))
for s, e in seven.items():
    print(f"{s:<6} " + tr("model states {states:>11} (paper's formula {formula:>11}, x{ratio:.2f}); ",
                          states=format_bytes(e.model_states_total), formula=format_bytes(paper[s]),
                          ratio=e.model_states_total / paper[s])
          + tr("rank peak {peak:>11}, reserved {needed:>11} of {usable} usable: {verdict}", peak=format_bytes(e.peak),
               needed=format_bytes(e.needed), usable=format_bytes(h100.usable),
               verdict=tr("fits") if e.needed <= h100.usable else tr("does not fit")))
fit_8 = [s for s, e in seven.items() if e.needed <= h100.usable]  # a card runs out on reserved memory
print(tr("fit: {fit} ({guess})", fit=fit_8, guess=guess(prediction_fit_8xh100)))

# %% [markdown]
# Sharding turns "does not fit any card" into "fits with room": the 16 bytes per parameter that
# DDP keeps on every rank become 16/8 = 2 per rank under FSDP, plus one block's gathered weights
# and the activations. The model states follow the ZeRO paper's formulas (DDP 16Ψ, ZeRO-1
# 4Ψ + 12Ψ/N, ZeRO-2 2Ψ + 14Ψ/N, FSDP 16Ψ/N, for Ψ parameters on N ranks), with two departures
# that come from torch itself, printed above as the ratio: DDP copies the gradients into its
# buckets unless `gradient_as_bucket_view=True` (the gradients' bytes again: 4 more per parameter
# in fp32 under DDP's autocast, 2 more in bf16 under ZeRO-1, which runs DDP), and ZeRO's
# partitions are whole tensors, so a rank's share is not exactly an eighth. For ZeRO the estimate runs rank 0 and the rank whose partition holds the most elements
# (`rank="all"` runs all eight). For the same job FSDP sends up to 1.5 times DDP's bytes per step
# and torch's ZeRO-1 adds a broadcast (section 3), which on eight cards linked by NVLink is usually
# a good trade.

# %%
assert seven["ddp"].needed > h100.usable  # replicated: 16 bytes per parameter do not fit 80 GB
assert seven["fsdp"].needed < h100.usable  # sharded eight ways: it fits
assert seven["fsdp"].peak < seven["zero2"].peak < seven["zero1"].peak < seven["ddp"].peak
assert abs(seven["fsdp"].model_states_total / paper["fsdp"] - 1) < 0.01  # 16 bytes per parameter / 8
assert abs(seven["ddp"].model_states_total / (paper["ddp"] + 4 * psi) - 1) < 0.01  # + the buckets' fp32 copy
buckets = {"zero1": 2 * psi, "zero2": 0}  # ZeRO-1 runs DDP: its buckets copy the bf16 gradients
for s in ("zero1", "zero2"):  # whole tensors: about the formula, never much below it
    assert 0.99 <= seven[s].model_states_total / (paper[s] + buckets[s]) < 1.2

# %% [markdown]
# ## 5. The other processes: DataLoader workers
#
# A job also grows past one process on the host: a `DataLoader` with `num_workers > 0` forks
# worker processes, children of the kernel. Forked workers share the kernel's pages until they
# write to them, and a dataset held as Python objects is written to all the time: reading an
# object updates its reference count, so each worker slowly copies the pages it touches
# (copy-on-write). vramlab shows the kernel's children as a layer of their own. Their summed RSS
# counts shared pages once per worker; their USS (`snapshot(uss=True)`) counts only the pages each
# holds alone, which is what the copies add.
#
# **Predict.** Two workers iterate once over a list of 200,000 Python tuples. Is what the workers
# hold alone (their USS) closer to zero, or to their summed RSS?

# %%
prediction_workers_uss = None  # your guess: "about zero" or "about their RSS"

# %%
data = [(i, float(i), str(i)) for i in range(200_000)]  # Python objects: every read writes a refcount
before = vramlab.snapshot(uss=True).host
loader = torch.utils.data.DataLoader(data, batch_size=1000, num_workers=2, persistent_workers=True,
                                     multiprocessing_context="fork", collate_fn=len)
batches = sum(1 for _ in loader)
during = vramlab.snapshot(uss=True).host
workers = during.children_count - before.children_count
added_rss = during.children_rss - before.children_rss
added_uss = during.children_uss - before.children_uss
closer_to = N_("about zero") if added_uss < added_rss - added_uss else N_("about their RSS")  # which one the USS is closer to
print(tr("{batches} batches; the kernel's children: {before} before the loader", batches=batches,
         before=before.children_count)
      + " " + tr("(helpers that the ranks of the sections above left, such as multiprocessing's resource tracker)")
      + tr(", {during} with it", during=during.children_count))
print(tr("the {workers} workers add: RSS summed {rss}, USS summed {uss} ({guess})", workers=workers,
         rss=format_bytes(added_rss), uss=format_bytes(added_uss), guess=guess(prediction_workers_uss, answer=closer_to)))
print(tr("the kernel itself: RSS {rss}", rss=format_bytes(during.process_rss)))
del loader  # ends the workers
after = vramlab.snapshot().host
print(tr("after the loader is gone: {n} children", n=after.children_count))

# %% [markdown]
# The workers' RSS counts the kernel's shared pages once per worker, and looks like several copies
# of the job; their USS shows what really was copied: the pages of the list that each worker
# touched. A list of tuples is the worst case. Keep a dataset in a NumPy array or a tensor (one
# object, no reference count per item), or read it from disk in the worker, and the workers copy
# almost nothing.

# %%
assert workers >= 2, (before.children_count, during.children_count)
assert 0 < added_uss < added_rss  # sharing made visible: what the workers hold alone is below their summed RSS
assert added_uss > 10 * MiB  # the touched pages of the list were copied
assert after.children_count <= before.children_count  # the workers are gone with the loader

# %% [markdown]
# ## Summary
#
# - DDP keeps everything on every rank: more cards buy speed, not memory, and its buckets cost a
#   copy of the gradients.
# - ZeRO-1, ZeRO-2 and FSDP divide the optimizer state, then the gradients, then the weights by
#   the number of ranks; the activations stay whole.
# - The memory saved can cost traffic: FSDP (the paper's stage 3) sends up to 1.5 times DDP's bytes
#   per step; the paper's stages 1 and 2 send what DDP sends, and torch's ZeRO-1, which adds a
#   broadcast to DDP's all-reduce, 1.5 times at 2 ranks.
# - `vramlab.estimate(..., world_size=N, strategy=...)` predicts a rank's peak from the wrappers'
#   own allocations, and `vramlab.distributed.report()` shows every rank's memory from inside a
#   `torchrun` script (`docs/distributed.md`).
# - DataLoader workers are children of the kernel: their USS, not their RSS, is what they add.
#
# ## Exercises
#
# 1. In section 2, which rank is ZeRO-1's busiest at 4 ranks, and how much more than the least
#    busy does it hold?
# 2. Estimate the 7B fine-tune under FSDP on 4 H100s instead of 8. Does it still fit?
#
# <details><summary>Solutions</summary>
#
# 1. The code below prints every rank's peak under ZeRO-1 at 4 ranks. The shares are whole
#    tensors, given out largest first, so the rank that gets the embedding holds the most.
# 2. The code below estimates it: each rank now holds a quarter of the sharded states instead of
#    an eighth, and the code prints what that does to the peak.
#
# </details>

# %% tags=["solution"]
# solution 1: ZeRO-1's ranks at 4 ranks
zero1_4 = [r.peak for r in measured["zero1", 4]]
busiest = max(range(4), key=lambda r: zero1_4[r])
print(tr("1. ZeRO-1, 4 ranks: ") + ", ".join(format_bytes(p) for p in zero1_4)
      + tr("; the busiest, rank {rank}, holds {more} more than the least busy", rank=busiest,
           more=format_bytes(max(zero1_4) - min(zero1_4))))

# solution 2: FSDP on 4 x H100 instead of 8
fsdp4 = vramlab.estimate(build_7b, batch_7b, batch_size=1, optimizer="adam", loss_fn=loss_7b, world_size=4,
                         strategy="fsdp", precision="bf16-mixed", device="H100-80GB")
print(tr("2. FSDP on 4 ranks: {peak} (8 ranks: {peak8}); ", peak=format_bytes(fsdp4.peak),
         peak8=format_bytes(seven["fsdp"].peak))
      + tr("{verdict} the H100's {usable}", verdict=tr("fits") if fsdp4.peak <= h100.usable else tr("does not fit"),
           usable=format_bytes(h100.usable)))
