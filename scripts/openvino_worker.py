"""OpenVINO GenAI's greedy decoding of token ids, for the benchmark's ``ov_*`` rows (``peers_openvino.py``).

Runs in the OpenVINO venv (``make openvino``), never in the project's: it imports nothing of the project.
``python openvino_worker.py --ir FOLDER --threads N`` reads one JSON request a line on stdin and writes one
JSON answer a line on stdout (anything OpenVINO prints goes to stderr):

    {"op": "generate", "prompt": [ids], "max_new_tokens": 64, "stop_token_ids": [2],
     "num_assistant_tokens": 5, "max_ngram_size": 3}     (the last two: prompt lookup; absent or null: plain)
    -> {"tokens": [ids], "steps": [tokens emitted by each main-model step], "seconds": wall time of generate}
    {"op": "info"} -> {"openvino": version, "openvino_genai": version, "properties": {...}}

A bad request gets {"error": "one line"} and the worker goes on; end of input ends it. Every pipeline runs with
the given threads and prefix caching off (a repeated prompt is prefilled again), and float32 inference and KV cache,
or with ``--precision bf16`` OpenVINO's bfloat16 inference precision (its default on a CPU with bf16) and a bfloat16
KV cache (with bf16 inference it refuses a float32 one; its default there is u8).
"""
import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

KINDS = ("plain", "pld")
PRECISIONS = ("f32", "bf16")


def properties(threads: int, precision: str = "f32") -> Dict[str, Any]:
    """The CPU plugin's settings: ``precision`` inference and KV cache (f32 or bf16; its default cache is u8,
    and bf16 inference refuses an f32 cache), no dynamic quantization, ``threads`` threads."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
            "INFERENCE_NUM_THREADS": threads}


class Engine:
    """The IR's pipelines, plain and prompt lookup, each made at its first request."""

    def __init__(self, ir: str, threads: int, precision: str = "f32"):
        properties(threads, precision)  # a bad precision fails here, before any pipeline
        self.ir, self.threads, self.precision, self.pipelines = ir, threads, precision, {}

    def pipeline(self, kind: str):
        if kind not in self.pipelines:
            import openvino_genai as genai

            scheduler = genai.SchedulerConfig()
            scheduler.enable_prefix_caching = False
            self.pipelines[kind] = genai.LLMPipeline(self.ir, "CPU", scheduler_config=scheduler, prompt_lookup=kind == "pld",
                                                     **properties(self.threads, self.precision))
        return self.pipelines[kind]

    def generate(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """The request checked first (without OpenVINO), then run on its pipeline."""
        prompt = _ids(request.get("prompt"), "prompt", least=1)
        stops = _ids(request.get("stop_token_ids", []), "stop_token_ids")
        longest = request.get("max_new_tokens")
        if not isinstance(longest, int) or isinstance(longest, bool) or longest < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {longest!r}")
        draft, ngram = request.get("num_assistant_tokens"), request.get("max_ngram_size")
        lookup = draft is not None or ngram is not None
        if lookup and not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (draft, ngram)):
            raise ValueError(f"prompt lookup needs positive integers num_assistant_tokens and max_ngram_size, got {draft!r}, {ngram!r}")
        import numpy as np
        import openvino as ov

        pipe = self.pipeline("pld" if lookup else "plain")
        config = pipe.get_generation_config()
        config.max_new_tokens, config.do_sample, config.min_new_tokens = longest, False, 0
        config.stop_token_ids = set(stops)
        config.eos_token_id = stops[0] if stops else -1  # none asked for: the IR's eos stops nothing either
        config.ignore_eos = not stops
        if lookup:
            config.num_assistant_tokens, config.max_ngram_size = draft, ngram
        config.validate()
        ids = ov.Tensor(np.array([prompt], dtype=np.int64))
        start = time.perf_counter()
        result = pipe.generate(ids, config)
        seconds = time.perf_counter() - start
        return {"tokens": [int(t) for t in result.tokens[0]], "steps": [int(b) for b in result.perf_metrics.raw_metrics.m_batch_sizes],
                "seconds": seconds}

    def info(self) -> Dict[str, Any]:
        import openvino
        import openvino_genai

        return {"openvino": openvino.__version__, "openvino_genai": openvino_genai.__version__, "properties": properties(self.threads, self.precision)}


def _ids(value: Any, name: str, least: int = 0) -> List[int]:
    if not isinstance(value, list) or len(value) < least or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                                    for t in value):
        raise ValueError(f"{name} must be a list of at least {least} token ids (non-negative integers)")
    return value


def answer(engine: Engine, line: str) -> Dict[str, Any]:
    """One request's answer; any failure is one line under "error"."""
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError("a request is a JSON object")
        op = request.get("op")
        if op == "generate":
            return engine.generate(request)
        if op == "info":
            return engine.info()
        raise ValueError(f"unknown op {op!r} (generate, info)")
    except json.JSONDecodeError as error:
        return {"error": f"not JSON: {error}"}
    except Exception as error:  # noqa: BLE001 (OpenVINO's "Check '...' failed at FILE:" lines end with what it means)
        last = [s.strip() for s in str(error).splitlines() if s.strip()][-1:] or [type(error).__name__]
        return {"error": last[0][:400]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ir", required=True, help="the exported OpenVINO IR folder")
    parser.add_argument("--threads", type=int, required=True, help="CPU inference threads")
    parser.add_argument("--precision", choices=PRECISIONS, default="f32", help="inference and KV cache precision")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.ir, "openvino_model.xml")):
        raise SystemExit(f"error: no OpenVINO model in {args.ir} (make openvino exports it)")
    out = os.fdopen(os.dup(1), "w")  # the protocol's stream; fd 1 (what OpenVINO may print) goes to stderr
    os.dup2(2, 1)
    engine = Engine(args.ir, args.threads, args.precision)
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(answer(engine, line)) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
