"""Embedded backend against raw llama-cpp-python, persona switches (warm, cold) against reloads.

    python bench/llm.py            # the default model (Qwen2.5-Coder-1.5B)
    python bench/llm.py --quick    # the test model, short runs (for development)
    python bench/llm.py --switch-only   # only the persona switches, warm and cold

Prints a table of ratios and writes bench/results/llm.json. Throughput: the same prompt
tokens and sampling settings go through ``Engine.generate`` and through raw
``Llama.create_completion``, each from an empty KV cache (target ≥ 0.95×). Switch latency: one
``Engine.activate`` between two adapters of the base (the shipped persona adapters, or random
LoRAs written with gguf-py when none are trained yet) against loading the model again
(target ≪ 1 ms, ≥ 1000× faster). A warm switch finds the adapter already in the engine's LRU
(``BATOS_ADAPTER_CAPACITY`` entries); a cold one first reads the file from disk, as on a
persona's first request or after its eviction. Whether the replies sound like their persona is
measured by bench/voice.py.
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

from batos.models.engine import Engine, Sampling
from batos.models.modelfile import adapter_path
from store.core.model_files import model_path

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
    """Warm switches (both adapters in RAM), cold ones (the file loaded first), model reloads."""
    shipped = sorted(adapter_path(which).glob("*.gguf"))
    tmp = Path(tempfile.mkdtemp(prefix="batos-bench-"))
    adapters = (
        shipped[:2]
        if len(shipped) >= 2
        else [_random_adapter(eng.gguf, tmp / f"r{i}.gguf", seed=i) for i in range(2)]
    )
    for path in adapters:
        eng._handle(path)  # both in RAM: the warm switch times only setting the adapter
    warm, cold = [], []
    eng.lock.acquire()
    try:
        for i in range(swaps):
            warm.append(eng.activate([adapters[i % 2]]))
        # Cold: the adapter is not in the LRU, so it is read from disk (llama_adapter_lora_init)
        # before it is set, as on a persona's first request or after its eviction.
        for i in range(max(6, swaps // 100)):
            path = adapters[i % 2]
            eng.activate([adapters[(i + 1) % 2]])
            with eng._registry:
                eng._free(path, eng._loaded[path])
            started = time.perf_counter()
            eng.activate([path])
            cold.append(time.perf_counter() - started)
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
    swap, first = statistics.median(warm), statistics.median(cold)
    reload = statistics.median(reloads)
    return {
        "adapters": "shipped" if len(shipped) >= 2 else "random (none trained yet)",
        "adapter_bytes": adapters[0].stat().st_size,
        "swap_ms": swap * 1000,
        "cold_ms": first * 1000,
        "reload_ms": reload * 1000,
        "speedup": reload / swap,
        "cold_vs_warm": first / swap,
        "reload_vs_cold": reload / first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="test model, short runs")
    parser.add_argument("--model", help="default | test | path (default: default, or test)")
    parser.add_argument(
        "--switch-only", action="store_true", help="only persona switches (no throughput runs)"
    )
    args = parser.parse_args()
    which = args.model or ("test" if args.quick else "default")
    tokens, runs, swaps = (32, 2, 200) if args.quick else (128, 3, 2000)
    eng = Engine(model_path(which), n_ctx=4096)
    report = {
        "model": which,
        "load_s": eng.load_s,
        "throughput": None if args.switch_only else throughput(eng, tokens, runs),
        "switch": switching(eng, which, swaps),
    }
    t, s = report["throughput"], report["switch"]
    if t is None:
        print(f"model {which}: {eng.gguf.name}, persona switches only")
        print(f"{'measure':34}{'ours':>12}{'reload':>15}{'ratio':>9}")
    else:
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
        f"{'warm persona switch vs reload (ms)':34}{s['swap_ms']:12.4f}{s['reload_ms']:15.1f}"
        f"{s['speedup']:8.0f}x   adapters: {s['adapters']}"
    )
    print(
        f"{'cold persona switch vs reload (ms)':34}{s['cold_ms']:12.3f}{s['reload_ms']:15.1f}"
        f"{s['reload_vs_cold']:8.0f}x   cold = {s['cold_vs_warm']:.0f}x a warm switch, "
        f"the {s['adapter_bytes'] / 1e6:.1f} MB adapter read from disk"
    )
    print("persona voice: see bench/voice.py")
    name = "llm-switch.json" if args.switch_only else "llm.json"
    out = Path(__file__).resolve().parent / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
