"""The same decoder in several fresh processes, timed in turn: does every process decode at the
same speed?

A decoder's speed depends on choices made when it is made (the thread threshold, the prompt
path), and a choice timed anew by each process moves with the noise of its moment. The book
keeps such choices per machine (:func:`smallem.cpu.machine.kept`); this measures whether that
is enough. ``measure(config, threads, processes, rounds)`` starts the processes one after the
other, each building the same model (seed 0) and rung 4's decoder (int8 on the threads); then
round by round it asks each in turn for one sample: an untimed decode (its weights back in the
caches after the others ran), then ``TIMED`` timed decodes of the chapter's feed, of which the
median is the round's sample. Processes waiting for their turn sleep on a pipe.

Run as ``python -m smallem.book.ch4.processes CONFIG THREADS``: one worker (what ``measure``
starts; its first line in is the prompt and the feed).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

RUNG = "threads"  # rung 4: int8 weights, the products on the threads
TIMED = 3         # timed decodes a turn; the turn's sample is their median


def _worker(config: str, threads: int):
    from smallem.generating import decode
    from smallem.training.model import GPT, get_config

    first = json.loads(sys.stdin.readline())  # the prompt and the tokens decoded after it
    prompt, feed = first["prompt"], first["feed"]

    model = GPT(get_config(config), "kernels", seed=0, threads=threads, pool=True)
    dec = decode.rung_decoder(RUNG, model, threads)

    def seconds():
        dec.reset()
        dec.prefill(prompt)
        t = time.perf_counter()
        for tok in feed:
            dec.step(tok)
        return time.perf_counter() - t

    seconds()
    print(json.dumps({"par_min_bytes": int(dec.par_min_bytes), "ahead": int(dec.ahead),
                      "tokens": len(feed)}), flush=True)
    for _ in sys.stdin:  # one line a turn; the pipe's end is the end
        seconds()
        print(json.dumps(statistics.median(seconds() for _ in range(TIMED))), flush=True)


def measure(config: str, threads: int, processes: int, rounds: int, prompt: list[int],
            feed: list[int]) -> list[dict]:
    """Each decode runs ``feed`` (token ids) after ``prompt``. Per process: its choices
    (``par_min_bytes``, ``ahead``), ``tokens`` a sample, and ``samples``, the seconds of each round's sample, the processes taken in turn, forwards
    in even rounds and backwards in odd ones. Raises RuntimeError where a worker dies."""
    procs, out = [], []
    try:
        for _ in range(processes):
            p = subprocess.Popen([sys.executable, "-m", __name__, config, str(int(threads))],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            procs.append(p)
            p.stdin.write(json.dumps({"prompt": [int(t) for t in prompt],
                                      "feed": [int(t) for t in feed]}) + "\n")
            p.stdin.flush()
            out.append({**_read(p), "samples": []})
        for r in range(rounds):
            order = range(processes) if r % 2 == 0 else reversed(range(processes))
            for i in order:
                procs[i].stdin.write("go\n")
                procs[i].stdin.flush()
                out[i]["samples"].append(float(_read(procs[i])))
    finally:
        for p in procs:
            if p.stdin and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    return out


def _read(p):
    line = p.stdout.readline()
    if not line:
        p.wait()
        err = p.stderr.read().strip().splitlines()
        raise RuntimeError(f"a decoding process died (exit {p.returncode})"
                           + (f": {err[-1][-300:]}" if err else ""))
    return json.loads(line)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
