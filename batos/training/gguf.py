"""llama.cpp's converters for persona adapters: peft LoRA → GGUF LoRA, merged model → GGUF.

The converters (``convert_lora_to_gguf.py``, ``convert_hf_to_gguf.py``, their ``conversion``
package and ``gguf-py``) ship in the llama-cpp-python sdist of the installed version, not in
its wheel, so they are unpacked once from that sdist into the model cache and run there in a
child process. ``verify_adapter`` loads a GGUF adapter against its base with llama.cpp itself.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from batos import settings
from batos.errors import ModelError
from batos.training.scratch import scratch as scratch_folder
from store.core.files import replacing

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("batos.training.gguf")

DISTRIBUTION = "llama-cpp-python"
#: What the converters need from ``vendor/llama.cpp`` of the sdist.
TOOL_MEMBERS = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "conversion/", "gguf-py/")
CONVERT_TIMEOUT = 1800


class ConversionError(ModelError):
    """llama.cpp's converters are unavailable, or refused an adapter or model."""


def tools_dir() -> Path:
    """The unpacked converters for the installed llama-cpp-python, fetched on first use."""
    version = importlib.metadata.version(DISTRIBUTION)
    target = Path(settings.get_str("model_cache")) / f"llama.cpp-tools-{version}"
    if (target / "convert_lora_to_gguf.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with scratch_folder("sdist", target.parent) as scratch:
        sdist = _sdist(version, Path(scratch))
        with replacing(target) as unpacked:
            _unpack(sdist, unpacked)
    log.info("unpacked llama.cpp converters %s into %s", version, target)
    return target


def _sdist(version: str, scratch: Path) -> Path:
    local = settings.get_str("llama_cpp_sdist")
    if local:
        path = Path(local).expanduser()
        if not path.is_file():
            raise ConversionError(
                f"BATOS_LLAMA_CPP_SDIST={local!r} is not a file",
                hint=f"point it at llama_cpp_python-{version}.tar.gz, or unset it to download",
            )
        return path
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"{DISTRIBUTION}=={version}",
        "-d",
        str(scratch),
        "--quiet",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(scratch.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not found:
        raise ConversionError(
            f"could not download the {DISTRIBUTION}=={version} sdist that carries llama.cpp's "
            f"converters: {(done.stderr or done.stdout).strip()[-400:]}",
            hint="connect to PyPI once, or set BATOS_LLAMA_CPP_SDIST to a downloaded "
            f"llama_cpp_python-{version}.tar.gz",
        )
    return found[0]


def _unpack(sdist: Path, into: Path) -> None:
    try:
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                parts = member.name.split("/", 3)
                if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"]:
                    continue
                inner = parts[3]
                if inner in TOOL_MEMBERS or inner.startswith(TOOL_MEMBERS[2:]):
                    member.name = inner
                    members.append(member)
            archive.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise ConversionError(
            f"{sdist} could not be unpacked: {exc}", hint="delete it and let it download again"
        ) from exc
    if not (into / "convert_lora_to_gguf.py").is_file():
        raise ConversionError(
            f"{sdist.name} holds no vendor/llama.cpp/convert_lora_to_gguf.py",
            hint=f"use the sdist of the installed {DISTRIBUTION} version",
        )


def _run(script: str, args: list[str], what: str) -> None:
    tools = tools_dir()
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    env["HF_HUB_OFFLINE"] = "1"
    try:
        done = subprocess.run(
            [sys.executable, str(tools / script), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=CONVERT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ConversionError(f"{what} took longer than {CONVERT_TIMEOUT}s") from exc
    if done.returncode != 0:
        raise ConversionError(
            f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}",
            hint="the base model's architecture or the adapter's modules may be unsupported "
            "by this llama.cpp version",
        )


def write_base_config(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path
) -> Path:
    """The base model's HF config and tokenizer: what the LoRA converter reads, no weights."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return forget_gguf_origin(folder)


def forget_gguf_origin(folder: Path) -> Path:
    """Drop the GGUF ``quantization_config`` from a saved config.json.

    The weights in hand are dequantized floats; left in, the GGUF origin sends llama.cpp's
    converters looking for a dequantizer they do not have.
    """
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


def convert_lora(lora_dir: Path, base_dir: Path, out: Path, outtype: str = "f16") -> Path:
    """Convert a peft adapter folder to a GGUF LoRA adapter file."""
    _run(
        "convert_lora_to_gguf.py",
        ["--base", str(base_dir), "--outfile", str(out), "--outtype", outtype, str(lora_dir)],
        f"converting the LoRA adapter in {lora_dir.name} to GGUF",
    )
    return out


def convert_model(hf_dir: Path, out: Path, outtype: str = "q8_0") -> Path:
    """Convert a Hugging Face model folder (config, tokenizer, safetensors) to one GGUF."""
    _run(
        "convert_hf_to_gguf.py",
        [str(hf_dir), "--outfile", str(out), "--outtype", outtype],
        f"converting the merged model in {hf_dir.name} to GGUF",
    )
    return out


# --- llama.cpp ------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_llama(base: Path) -> Iterator[object]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(base), n_ctx=1024, n_threads=2, verbose=False, seed=0)
    try:
        yield llm
    finally:
        llm.close()


def greedy_reply(llm: object, system: str, prompt: str, max_tokens: int) -> str:
    reply = llm.create_chat_completion(  # type: ignore[attr-defined]
        messages=[{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        temperature=0.0,
        top_k=1,
        max_tokens=max_tokens,
        seed=0,
    )
    return reply["choices"][0]["message"]["content"]


def verify_adapter(
    base: Path, adapter: Path, system: str, prompt: str, max_tokens: int = 40
) -> tuple[str, str]:
    """Greedy replies to one prompt without and with ``adapter`` applied to ``base``.

    Raises ``ConversionError`` when llama.cpp refuses the adapter (e.g. it was trained on
    another base model).
    """
    import ctypes

    import llama_cpp

    with _quiet_llama(base) as llm:
        plain = greedy_reply(llm, system, prompt, max_tokens)
        handle = llama_cpp.llama_adapter_lora_init(llm.model, str(adapter).encode())  # type: ignore[attr-defined]
        if not handle:
            raise ConversionError(
                f"llama.cpp refused the adapter {adapter.name} for base {base.name}",
                hint="it was trained on another base model: train it again for this one",
            )
        ctx = llm.ctx  # type: ignore[attr-defined]
        try:
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(handle)
            scales = (ctypes.c_float * 1)(1.0)
            if llama_cpp.llama_set_adapters_lora(ctx, adapters, 1, scales) != 0:
                raise ConversionError(f"llama.cpp could not apply {adapter.name}")
            # The KV cache still holds the plain model's keys for the shared prompt prefix.
            llm.reset()  # type: ignore[attr-defined]
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            adapted = greedy_reply(llm, system, prompt, max_tokens)
        finally:
            llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
            llama_cpp.llama_adapter_lora_free(handle)
    return plain, adapted
