"""OpenVINO GenAI as the benchmark's peer rows (``strategies.OPENVINO_PEERS``; docs/openvino.md): its plain greedy
decoding and its prompt lookup on the embedded model exported to OpenVINO IR in float32 (``make openvino``), run
through ``openvino_genai.LLMPipeline`` by a worker process of the OpenVINO venv (``scripts/openvino_worker.py``) on the
project's own token ids, new-token budget, end tokens and torch's thread count."""
import atexit
import functools
import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from configuration import RunConfig, RunContext
from sampling.stats import GenerationStats
from utils.models import cache_dir

ROOT = Path(__file__).resolve().parent
WORKER = ROOT / "scripts" / "openvino_worker.py"
IR_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml", "config.json")
STAMP = "export.json"  # written last into the export: its versions and what it was verified against
INSTALL = "install: make openvino (docs/openvino.md)"


def venv() -> Path:
    """The OpenVINO venv: $SPECDEC_OPENVINO_VENV (``make openvino``'s setting too), else the one the export's stamp
    records (the venv ``make openvino`` exported with), else ``.venv-openvino`` in the checkout."""
    given = os.environ.get("SPECDEC_OPENVINO_VENV") or stamp(ir_dir()).get("venv")
    return Path(given) if given else ROOT / ".venv-openvino"


def ir_dir() -> Path:
    """Where ``make openvino`` exports the embedded model (float32 IR), in the project's model cache."""
    return cache_dir() / "SmolLM2-135M-Instruct-openvino-fp32"


def stamp(folder: Path) -> Dict[str, Any]:
    """The export's stamp in ``folder`` ({} where there is none or it is unreadable)."""
    try:
        found = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


@functools.lru_cache(maxsize=None)
def genai_version(python: Path) -> Optional[str]:
    """The OpenVINO GenAI version ``python``'s venv imports (as its ``__version__`` says), None where it imports none."""
    try:
        done = subprocess.run([str(python), "-c", "import openvino_genai; print(openvino_genai.__version__)"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def ir_problem(folder: Path) -> Optional[str]:
    """Why ``folder`` is not a complete export (None if it is): a file missing or empty, or no stamp."""
    for name in IR_FILES + (STAMP,):
        path = folder / name
        if not path.is_file() or path.stat().st_size == 0:
            return f"no {name}"
    return None


def unavailable(args: Any = None) -> str:
    """Why the OpenVINO rows cannot run here ("" when they can), in one line that says how to install."""
    python = venv() / "bin" / "python"
    if not python.is_file():
        return f"the OpenVINO venv {venv()} is missing; {INSTALL}"
    if not (venv() / ".installed").is_file():
        return f"the OpenVINO venv {venv()} is incomplete; {INSTALL}"
    problem = ir_problem(ir_dir())
    if problem is not None:
        return f"the embedded model's OpenVINO export {ir_dir()} is missing or incomplete ({problem}); {INSTALL}"
    stamped, have = stamp(ir_dir()).get("openvino_genai"), genai_version(python)
    if have is None:
        return f"the OpenVINO venv {venv()} cannot import openvino_genai; {INSTALL}"
    if stamped != have:
        return f"the OpenVINO export {ir_dir()} was made with OpenVINO GenAI {stamped}, the venv {venv()} has {have}; {INSTALL}"
    if args is not None and (getattr(args, "target", None) or getattr(args, "preset", None) not in (None, "embedded")):
        return "the OpenVINO rows run the embedded model only (its export); this run's target is another"
    return ""


TIMEOUT = 600.0  # seconds one request may take (its first builds the pipeline); then the worker is killed


class Worker:
    """One ``scripts/openvino_worker.py`` process: a JSON request a line in, a JSON answer a line out. A worker
    that hangs (no answer within ``TIMEOUT``), dies or answers garbage is killed, and the request fails in one line."""

    def __init__(self, ir: Path, threads: int, python: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
                 stderr: Any = None, precision: str = "f32"):
        """``env``: variables added to this process's; ``stderr``: where the worker's goes (default: this process's);
        ``precision``: OpenVINO's inference precision, f32 (the benchmark's rows) or bf16."""
        python = python or venv() / "bin" / "python"
        self.threads = threads
        self.process = subprocess.Popen([str(python), str(WORKER), "--ir", str(ir), "--threads", str(threads),
                                         "--precision", precision],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1,
                                        env={**os.environ, **env} if env else None)
        self.lines: "queue.Queue[str]" = queue.Queue()  # its stdout, a line at a time ("" at its end), read by a thread
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """The answer to ``request``; RuntimeError with one line for the worker's error, its death, its silence
        past ``TIMEOUT`` or an answer that is not one (the worker is then killed: ``worker`` starts another)."""
        try:
            if not self.alive():
                raise BrokenPipeError
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.lines.get(timeout=TIMEOUT)
        except (BrokenPipeError, OSError):
            line = ""
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"the OpenVINO worker gave no answer within {TIMEOUT:g} s: killed") from None
        if not line:
            self.kill()
            raise RuntimeError(f"the OpenVINO worker ended (exit status {self.process.returncode}); its stderr is above")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            raise RuntimeError(f"the OpenVINO worker gave not a JSON answer: {line.strip()[:120]!r}; killed")
        if "error" in answer:
            raise RuntimeError(f"OpenVINO worker: {answer['error']}")
        return answer

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.alive():
            try:
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


_WORKERS: Dict[int, Worker] = {}  # threads -> the worker this process keeps


def worker(threads: int) -> Worker:
    """This process's worker for ``threads`` threads, started at the first call and again after one has ended
    (refused in one line where OpenVINO is not installed), ended at exit."""
    if threads not in _WORKERS or not _WORKERS[threads].alive():
        why = unavailable()
        if why:
            raise RuntimeError(why)
        _WORKERS[threads] = Worker(ir_dir(), threads)
        atexit.register(_WORKERS[threads].close)
    return _WORKERS[threads]


def ov_generate(prompt: List[int], c: RunConfig, stats: GenerationStats, draft: Optional[int] = None, ngram: int = 3) -> List[int]:
    """OpenVINO GenAI's greedy decoding of ``prompt``, prompt lookup with ``draft`` tokens and n-grams up to
    ``ngram`` when ``draft`` is given; ``stats`` gets its steps (``raw_metrics.m_batch_sizes``: the tokens each
    main-model step emitted, so that accepted drafts are their sum less one per step)."""
    import torch

    if not c.greedy:
        raise ValueError("the OpenVINO peers are run greedy only")
    request = {"op": "generate", "prompt": list(prompt), "max_new_tokens": c.max_gen_len, "stop_token_ids": list(c.eos_tokens_id)}
    if draft is not None:
        request.update(num_assistant_tokens=draft, max_ngram_size=ngram)
    answer = worker(torch.get_num_threads()).ask(request)
    tokens, steps = answer["tokens"], answer["steps"]
    stats.generated, stats.target_forward_passes = len(tokens), len(steps)
    stats.accepted = sum(steps) - len(steps)
    stats.emitted_by_step = list(steps)
    stats.peer_settings = {"engine": "OpenVINO GenAI", "threads": torch.get_num_threads(),
                           **({"num_assistant_tokens": draft, "max_ngram_size": ngram} if draft is not None else {})}
    return tokens


def _ov_plain(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """OpenVINO GenAI's plain greedy decoding."""
    return ov_generate(prompt, c, stats)


def _ov_pld(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """OpenVINO GenAI's prompt lookup at its sample's settings: 5 draft tokens, n-grams up to 3."""
    return ov_generate(prompt, c, stats, draft=5, ngram=3)


def _ov_pld10(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """OpenVINO GenAI's prompt lookup with 10 draft tokens (our ``pld``'s count), n-grams up to 3."""
    return ov_generate(prompt, c, stats, draft=10, ngram=3)
