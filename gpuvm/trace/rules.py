"""The rules of the Chrome Trace Event Format that our traces rely on, checked offline.

Why here and not only Perfetto's importer: reading a trace back with trace_processor
needs its binary, which the perfetto package downloads on first use -- and nothing in
the tests may reach the network.  These are the rules the format's specification
("Trace Event Format", the JSON Object Format) and Perfetto's JSON importer state for
the events we write, so a trace that passes them opens in ui.perfetto.dev as recorded:

- the file is an object with a `traceEvents` list; `displayTimeUnit` is "ms" or "ns";
- every event has a one-letter phase `ph` the format defines, a string `name`, integer
  `pid` and `tid`, and (but for metadata) a finite, non-negative `ts` in microseconds;
- complete events (X) have a finite `dur` >= 0; on one thread they nest -- a slice that
  starts inside another ends inside it (Perfetto moves one that does not to a separate
  "overlapping" track and counts an import error);
- begin/end events (B/E) pair up on their thread, last begun first ended;
- instant events (i/I) have scope `s` of g, p or t (t when absent);
- counter events (C) carry numbers only in `args`;
- metadata events (M) are process_name/thread_name (with a string `args.name`) or
  process_sort_index/thread_sort_index (an integer `args.sort_index`), process_labels.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

EVENT_PHASES = set("BEXiICbnesStTpFfPONDMVvRc()") | {"I"}
METADATA = {"process_name": "name", "thread_name": "name", "process_labels": "labels",
            "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _event_problems(n: int, e: Any) -> list[str]:
    if not isinstance(e, dict):
        return [f"event {n}: not an object"]
    where = f"event {n} ({e.get('ph')!r} {e.get('name')!r})"
    out = []
    ph = e.get("ph")
    if ph not in EVENT_PHASES:
        return [f"{where}: unknown phase"]
    if not isinstance(e.get("name"), str):
        out.append(f"{where}: name must be a string")
    for key in ("pid", "tid"):
        if key in e and not (isinstance(e[key], int) and not isinstance(e[key], bool)):
            out.append(f"{where}: {key} must be an integer")
    if "pid" not in e:
        out.append(f"{where}: no pid")
    if ph != "M" and not (_number(e.get("ts")) and e["ts"] >= 0):
        out.append(f"{where}: ts must be a finite number >= 0 (microseconds)")
    if "args" in e and not isinstance(e["args"], dict):
        out.append(f"{where}: args must be an object")
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    if ph == "X" and not (_number(e.get("dur")) and e["dur"] >= 0):
        out.append(f"{where}: a complete event needs a finite dur >= 0")
    if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
        out.append(f"{where}: instant scope s must be g, p or t")
    if ph == "C" and (not args or not all(_number(v) for v in args.values())):
        out.append(f"{where}: a counter's args must be numbers")
    if ph == "M":
        key = METADATA.get(e.get("name"))
        if key is None:
            out.append(f"{where}: unknown metadata name")
        elif key == "name" and not isinstance(args.get("name"), str):
            out.append(f"{where}: needs a string args.name")
        elif key == "sort_index" and not isinstance(args.get("sort_index"), int):
            out.append(f"{where}: needs an integer args.sort_index")
    return out


def _nesting_problems(events: list[dict[str, Any]]) -> list[str]:
    """Slices (X, and B/E pairs) on each thread must nest."""
    out = []
    by_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    open_: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in sorted((e for e in events if e["ph"] in "XBE"), key=lambda e: e["ts"]):
        thread = (e["pid"], e.get("tid", 0))
        if e["ph"] == "X":
            by_thread[thread].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "B":
            open_[thread].append(e)
        elif not open_[thread]:
            out.append(f"thread {thread}: end event {e['name']!r} at {e['ts']} without a "
                       f"begin")
        else:
            b = open_[thread].pop()
            by_thread[thread].append((b["ts"], e["ts"], b["name"]))
    out += [f"thread {t}: begin event {s[-1]['name']!r} never ended"
            for t, s in open_.items() if s]
    for thread, slices in by_thread.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                out.append(f"thread {thread}: slice {name!r} [{start}, {end}] overlaps "
                           f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}] without "
                           f"nesting in it")
            stack.append((start, end, name))
    return out


def problems(trace: Any) -> list[str]:
    """Every broken rule of the format in a loaded trace (json.load of the file), one
    line each; [] for a trace Perfetto imports without an error."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    out = []
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        out.append("displayTimeUnit must be \"ms\" or \"ns\"")
    events = trace["traceEvents"]
    for n, e in enumerate(events):
        out += _event_problems(n, e)
    if not out:
        out += _nesting_problems(events)
    return out
