"""Prompt-lookup decoding, on and off: does llama.cpp's speculative path pay on this machine?

    python bench/prompt_lookup.py            # the default model, 4 dev document questions
    python bench/prompt_lookup.py --quick    # the test model, 2 questions

An answer about documents often repeats words of its passages, so drafting the next tokens by
looking them up in the prompt (llama-cpp-python's ``LlamaPromptLookupDecoding``, after Saxena's
prompt-lookup decoding) could let one batched step verify several tokens at once. Each question
is answered greedily (temperature 0, the same seed) from the first ``--chars`` characters of its
own document, with the plain ``Llama`` and with the draft at each ``--drafts`` size; the bench
prints seconds, tokens a second, the ratio to plain, and whether the reply is the same text.
Greedy decoding verified token by token should give the same text; a run that does not is a
defect of the path, not a speed-up. The question set is the dev split of bench/usefulness.py.
Writes bench/results/prompt_lookup-<model>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).resolve().parent / "data" / "usefulness" / "dev"
RESULTS = Path(__file__).resolve().parent / "results"


def questions(n: int, chars: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (DATA / "doc_questions.jsonl").read_text().splitlines()]
    out, seen = [], set()
    for row in rows:  # one question a document: the passages differ
        if row["source"] in seen:
            continue
        seen.add(row["source"])
        text = (DATA / "docs" / row["source"]).read_text(encoding="utf-8")[:chars]
        out.append((row["question"], text))
        if len(out) == n:
            break
    return out


def answer(llm: object, question: str, passage: str, tokens: int) -> tuple[str, int, float]:
    messages = [
        {"role": "system", "content": "Answer from the passage, in its own words where you can."},
        {"role": "user", "content": f"Passage [1]:\n{passage}\n\nQuestion: {question}"},
    ]
    started = time.perf_counter()
    out = llm.create_chat_completion(  # type: ignore[attr-defined]
        messages, temperature=0.0, max_tokens=tokens, seed=1
    )
    seconds = time.perf_counter() - started
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the test model, 2 questions")
    parser.add_argument("--model", help="default | test")
    parser.add_argument("--questions", type=int, help="questions (default 4; 2 with --quick)")
    parser.add_argument("--chars", type=int, default=1500, help="passage length in characters")
    parser.add_argument("--tokens", type=int, default=64, help="reply length cap")
    parser.add_argument("--drafts", default="10,4", help="draft sizes, comma-separated")
    args = parser.parse_args()
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from store.core.model_files import model_path

    which = args.model or ("test" if args.quick else "default")
    n = args.questions or (2 if args.quick else 4)
    chosen = questions(n, args.chars)
    sizes = [0, *(int(x) for x in args.drafts.split(",") if x.strip())]
    rows: list[dict[str, object]] = []
    plain: dict[str, tuple[str, float]] = {}
    for size in sizes:
        options: dict[str, object] = {"n_ctx": 4096, "n_batch": 512, "verbose": False}
        if size:
            options["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=size)
        llm = Llama(str(model_path(which)), **options)
        for question, passage in chosen:
            try:
                text, count, seconds = answer(llm, question, passage, args.tokens)
            except Exception as exc:  # the speculative path's own defects are a finding
                rows.append({"draft": size, "question": question, "error": repr(exc)[:300]})
                print(f"draft {size:>2}  failed: {exc!r:.120}  {question[:50]}", flush=True)
                # its state is now unknown: a fresh model for the next question
                llm = Llama(str(model_path(which)), **options)
                continue
            base = plain.setdefault(question, (text, seconds))
            row = {
                "draft": size,
                "question": question,
                "seconds": round(seconds, 2),
                "tokens": count,
                "tokens_per_s": round(count / seconds, 1) if seconds else None,
                "vs_plain": round(seconds / base[1], 2),
                "same_text": text == base[0],
            }
            rows.append(row)
            print(
                f"draft {size:>2}  {seconds:7.2f} s  {row['tokens_per_s']:>6} tok/s  "
                f"×{row['vs_plain']:<5} same text: {row['same_text']}  {question[:50]}",
                flush=True,
            )
        del llm
    print(f"\n{'draft':>6}{'answered':>10}{'seconds':>10}{'× plain':>10}{'same text':>12}")
    for size in sizes:
        mine = [r for r in rows if r["draft"] == size and "error" not in r]
        tried = sum(r["draft"] == size for r in rows)
        total = sum(float(r["seconds"]) for r in mine)  # type: ignore[arg-type]
        base = sum(plain[str(r["question"])][1] for r in mine)
        same = sum(bool(r["same_text"]) for r in mine)
        ratio = f"{total / base:.2f}" if base else "—"
        print(
            f"{size:>6}{f'{len(mine)}/{tried}':>10}{total:>10.1f}{ratio:>10}"
            f"{f'{same}/{len(mine)}':>12}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"prompt_lookup-{which}.json"
    out.write_text(json.dumps({"model": which, "tokens": args.tokens, "rows": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
