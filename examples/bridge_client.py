"""A small Synaptic Bridge client: send one request, print the answer as it streams.

batos bridge --bind tcp://127.0.0.1:5555 &
python examples/bridge_client.py "how do I plan a vegetable garden?" --persona brick
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import zmq


def ask(
    address: str, text: str, *, persona: str | None, thread_id: str | None, timeout_s: float
) -> int:
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    body: dict = {"input": {"messages": [{"role": "user", "content": text}]}}
    if persona:
        body["context"] = {"persona": persona}
    if thread_id:
        body["thread_id"] = thread_id
    request_id = uuid.uuid4().hex.encode()
    socket.send_multipart([b"BATOS/1", request_id, json.dumps(body).encode()])
    try:
        while True:
            if not socket.poll(int(timeout_s * 1000)):
                print(f"\nno reply within {timeout_s} s", file=sys.stderr)
                return 2
            reply_id, kind, data = socket.recv_multipart()
            if reply_id != request_id:
                continue  # another request's reply on a shared socket
            payload = json.loads(data)
            if kind == b"token" and payload["node"] == "synthesize":
                print(payload["text"], end="", flush=True)
            elif kind == b"update":
                print(f"[{payload['node']}]", file=sys.stderr)
            elif kind == b"result":
                print()
                if payload["status"] != "COMPLETE":
                    failure = payload["failure"] or {}
                    print(
                        f"FAILED: {failure.get('reason')} ({failure.get('hint')})", file=sys.stderr
                    )
                    return 1
                print(f"thread {payload['thread_id']}, cycle {payload['cycle']}", file=sys.stderr)
                return 0
            elif kind == b"error":
                print(f"error: {payload['message']}\nhint: {payload['hint']}", file=sys.stderr)
                return 1
    finally:
        socket.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text")
    parser.add_argument("--bridge", default="tcp://127.0.0.1:5555")
    parser.add_argument("--persona")
    parser.add_argument("--thread")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    return ask(
        args.bridge, args.text, persona=args.persona, thread_id=args.thread, timeout_s=args.timeout
    )


if __name__ == "__main__":
    sys.exit(main())
