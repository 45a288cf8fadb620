"""vramlab against published GPU measurements (benchmarks/published.py), with accelerate's and DeepSpeed's rules.

    python benchmarks/bench_published.py [--rows B1,L1,...] [--what-if-dropout] [--write-doc]

For every row of ``published.ROWS`` (a real measurement someone published, with its source,
counter and card): the measured figure, vramlab's estimate of the same training step on fake
tensors (the figure the row's counter compares with: ``peak_reserved`` + the page's measured
1343 MiB CUDA context for NVML rows, ``peak`` for ``max_memory_allocated`` and
``memory_summary`` rows), accelerate ``estimate-memory``'s "Training using Adam" and
DeepSpeed's ZeRO-2/ZeRO-3 model-states estimates (their formulas re-implemented in
``published.py``: neither package is installed), each as a ratio to the measured figure, and
how long each estimate took. With ``--write-doc`` the table, the citations and the command
go to docs/published-measurements.md (the whole file is written by this script).
``--what-if-dropout`` also runs the BERT rows with every dropout keeping an input-dtype mask
(``published.what_if_input_dtype_dropout``), the experiment behind the B rows' diagnosis.

Sizes are printed in GiB (2**30 bytes); the measured column also shows the figure as published
(HF "MB" and Lightning "MB" are MiB; litgpt "GB" is 10**9 bytes).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import published  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "published-measurements.md"
GiB = 2**30
WITHIN = 0.10


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="comma-separated row ids (default: all)")
    ap.add_argument("--what-if-dropout", action="store_true",
                    help="also run the BERT rows with input-dtype dropout masks (what-if, not the benchmark)")
    ap.add_argument("--write-doc", action="store_true", help=f"write {DOC.relative_to(DOC.parents[1])}")
    args = ap.parse_args()
    rows = published.ROWS
    if args.rows:
        wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
        unknown = [w for w in wanted if w not in published.BY_ID]
        if unknown:
            raise SystemExit(f"unknown row(s) {unknown}; known: {', '.join(published.BY_ID)}")
        rows = [published.BY_ID[w] for w in wanted]

    warnings.filterwarnings("ignore")
    t_all = time.perf_counter()
    lines = []
    details = []
    for row in rows:
        res = published.run_row(row)
        oth = published.other_estimates(row)
        m = row.measured
        est = res.estimate
        ok = abs(res.ratio - 1) <= WITHIN
        line = (row.id, row.measured_text, gib(m), gib(res.compared), f"{res.ratio:.3f}", "yes" if ok else "no",
                gib(oth.accelerate), f"{oth.accelerate / m:.2f}", gib(oth.zero2), f"{oth.zero2 / m:.2f}",
                gib(oth.zero3), f"{oth.zero3 / m:.2f}", f"{res.seconds:.1f}", f"{oth.accelerate_seconds:.2f}",
                f"{oth.deepspeed_seconds:.2f}")
        lines.append(line)
        details.append((row, res, est))
        print(" | ".join(line), flush=True)
    total = time.perf_counter() - t_all

    header = ("id", "measured (as published)", "measured GiB", "vramlab GiB", "vramlab/measured", "within 10%",
              "accelerate GiB", "acc/measured", "ZeRO-2 GiB", "z2/measured", "ZeRO-3 GiB", "z3/measured",
              "vramlab s", "accelerate s", "DeepSpeed s")
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(line) + " |" for line in lines]
    print()
    print("\n".join(table))
    print(f"\n{len(rows)} rows in {total:.0f} s")

    what_if: list[str] = []
    if args.what_if_dropout:
        what_if = ["| id | measured GiB | vramlab GiB, input-dtype dropout masks | ratio | ratio as benchmarked | s |",
                   "|---|---|---|---|---|---|"]
        for (row, res, _est) in details:
            if not row.id.startswith("B"):
                continue
            alt = published.run_row(published.what_if_input_dtype_dropout(row))
            what_if.append(f"| {alt.row.id} | {gib(row.measured)} | {gib(alt.compared)} | {alt.ratio:.3f} | "
                           f"{res.ratio:.3f} | {alt.seconds:.1f} |")
            print(what_if[-1], flush=True)

    if args.write_doc:
        write_doc(table, details, total, " ".join(["python", "benchmarks/bench_published.py", *sys.argv[1:]]),
                  what_if)


def write_doc(table: list[str], details: list, total: float, cmd: str, what_if: list[str]) -> None:
    when = time.strftime("%Y-%m-%d")
    machine = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"
    import torch
    import transformers

    out = [
        "# vramlab against published GPU memory measurements",
        "",
        "Each row is a REAL measurement someone published (source, quote and counter below); vramlab estimates the "
        "same training step on fake tensors, from the model's published config (no weights downloaded). The rows, "
        "their setups and what each copies from its source are in `benchmarks/published.py`; "
        "`tests/sim/test_published.py` asserts the fast rows and lists the known misses.",
        "",
        f"Regenerate: `{cmd.replace(' --write-doc', '')} --write-doc` "
        f"(run {when}; {machine}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{len(details)} rows took {total:.0f} s).",
        "",
        "How each counter is compared:",
        "",
        "- `nvml_used_after` (HF docs, \"GPU memory occupied\", NVML read after `trainer.train()` returned; nothing "
        "called `empty_cache`): vramlab's `peak_reserved` (caching allocator) + the 1343 MiB CUDA context the same "
        "page measured (`torch.ones((1, 1)).to(\"cuda\")` → \"GPU memory occupied: 1343 MB\"). MB = MiB.",
        "- `max_allocated` (litgpt: `torch.cuda.max_memory_allocated() / 1e9`, printed after training; decimal GB, "
        "rounded to 0.01; bitsandbytes' table, Q rows: `max_memory_allocated()` in MiB over 13 steps, reset before "
        "the model is built): vramlab's `peak`. bitsandbytes' paged state (unified memory) is in neither figure; "
        "the Q3/Q4 details compare it with the table's \"Optimizer State on CPU\".",
        "- `memory_summary_peak` (Lightning Fabric docs: `torch.cuda.memory_summary()` after 10 steps, \"Memory (MB)\"; "
        "the docs do not say which row, the allocated peak is assumed; MB = MiB): vramlab's `peak`.",
        "",
        "The other estimators (formulas in `benchmarks/published.py`, from the sources cited there): accelerate "
        "`estimate-memory`'s \"Training using Adam\" (`4 x` the base model's float32 size for float32 runs, `2 x` for "
        "16-bit ones; the base model is what `AutoModel` builds, without the task head; the Lightning demo is not on "
        "the Hub, so the formula is applied to it directly); DeepSpeed's `estimate_zero2_model_states_mem_needs` "
        "(`2P + 18P/N`) and `estimate_zero3_model_states_mem_needs` (`4L + 18P/N`), no offload, P every parameter "
        "(trainable or not: LoRA rows get full-fine-tune figures), N the row's GPUs. Both leave activations out; "
        "their times include building the model on the meta device.",
        "",
        *table,
        "",
        *([
            "What-if (not the benchmark; `--what-if-dropout`): the BERT rows again with every dropout keeping its "
            "mask in the input's dtype (torch's non-fused `_dropout_impl`) instead of CUDA's 1-byte mask, the "
            "experiment behind the B rows' diagnosis below:",
            "",
            *what_if,
            "",
        ] if what_if else []),
        "## Rows",
        "",
    ]
    for row, res, est in details:
        miss = published.DIAGNOSES.get(row.id)
        out += [
            f"### {row.id}: {row.model}",
            "",
            f"- Source: <{row.source}>",
            f"- Quote: {row.quote}",
            f"- Setup: micro-batch {row.batch}" + (f" (gradient accumulation {row.grad_accum})" if row.grad_accum > 1
                                                   else "") +
            f", sequence {row.seq}, precision `{row.precision}`, optimizer {row.optimizer}, checkpointing "
            f"{row.checkpointing}, strategy {row.strategy} ({row.world_size} GPU{'s' if row.world_size > 1 else ''}), "
            f"card preset `{row.card}`.",
            f"- Counter: `{row.counter}`, compared with vramlab's {row.compared_as}.",
            f"- Measured {row.measured_text} = {row.measured:,} bytes; vramlab {res.compared:,} bytes "
            f"(peak {est.peak:,}, peak_reserved {est.peak_reserved:,}); ratio {res.ratio:.3f}.",
            f"- Notes: {row.notes}",
        ]
        if row.id in published.BNB_PAGED_STATE:
            out.append(f"- Paged optimizer state: vramlab {est.paged:,} bytes = {est.paged / 2**20:.2f} MiB "
                       f"(`Estimate.paged`); the table's \"Optimizer State on CPU\": "
                       f"{published.BNB_PAGED_STATE[row.id]} MB.")
        if miss:
            out.append(f"- Outside 10%, what was found: {miss}")
        out.append("")
    DOC.write_text("\n".join(out))
    print(f"[wrote {DOC.relative_to(DOC.parents[1])}]", file=sys.stderr)


if __name__ == "__main__":
    main()
