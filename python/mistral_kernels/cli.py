"""Command line: ``mistral-kernels generate``, ``info`` and ``serve`` (also ``python -m mistral_kernels``).

Examples::

    mistral-kernels generate --chat --prompt "What is the capital of France?"
    mistral-kernels generate --model ./Mistral-7B-v0.1 --prompt "Hello" --prompt "Bonjour" --max-new-tokens 32
    mistral-kernels info --model ./model.gguf
    mistral-kernels serve --port 8000        # OpenAI-compatible HTTP server (pip install ".[serve]")
    torchrun --nproc-per-node 2 -m mistral_kernels serve --tp 2 --device cuda --model ./Mixtral-8x7B
    torchrun --nproc-per-node 2 -m mistral_kernels generate --tp 2 --model ./Mixtral-8x7B --device cuda \
        --dtype bf16 --prompt "Hello"          # tensor / expert parallel over 2 GPUs; only rank 0 prints
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import warnings
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .engine_args import EngineArgs, torch_dtype
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .engine import Completion, Engine
    from .parallel import ParallelContext


class UsageError(Exception):
    """A user error found after parsing: ``main`` prints it as one line on stderr and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with a parse error as one line on stderr (exit 2), not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _utf8(flag: str, text: str) -> str:
    """``text`` unchanged if it is valid UTF-8; an argv that was not is decoded by Python with lone
    surrogates (U+DC80 + byte), which the tokenizers cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = ord(text[e.start]) - 0xDC00
        raise UsageError(f"{flag} is not valid UTF-8 (byte 0x{byte:02x} at character {e.start})") from None
    return text


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def init_parallel(args: argparse.Namespace) -> tuple[ParallelContext | None, str]:
    """Join torchrun's process group for ``--tp`` (or when torchrun started several processes); the context
    (None for one process) and this rank's device. Raises UsageError when --tp is not the process count."""
    if args.tp == 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None, args.device
    from .parallel import ParallelContext

    try:
        return ParallelContext.init_from_env(args.tp, args.device, moe=args.moe_parallel)
    except ValueError as e:
        raise UsageError(str(e)) from None


def destroy_parallel(parallel: ParallelContext | None) -> None:
    if parallel is not None and parallel.world_size > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def prefix_cache_stats(engine: Engine) -> str:
    """The stats-line field: prefix-cache hits / queried tokens of the admitted requests."""
    if not engine.blocks.prefix_caching:
        return "prefix cache off"
    s = engine.stats
    return f"prefix cache hit {s.prefix_hit_rate:.1%} ({s.prefix_hit_tokens}/{s.prefix_query_tokens} tok)"


def speculative_stats(engine: Engine) -> str:
    """The stats-line field of speculative decoding: accepted / proposed tokens (empty when off)."""
    if engine.speculator is None:
        return ""
    s = engine.stats
    return (f" | spec {engine.speculator.config.method} accepted {s.spec_acceptance_rate:.1%} "
            f"({s.spec_accepted_tokens}/{s.spec_proposed_tokens} tok)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every flag documented in README, section "Generation")."""
    parser = _Parser(prog="mistral-kernels",
                                     description="Generate text with Mistral-family models on mistral-kernels ops.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text (streams a single prompt to stdout)")
    g.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    g.add_argument("--prompts-file", help="file with one prompt per line (blank lines ignored)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    g.add_argument("--system", help="system message (with --chat)")
    SamplingParams.add_cli_args(g.add_argument_group("sampling (SamplingParams)"))
    EngineArgs.add_cli_args(g.add_argument_group("engine"))

    from .serve.args import add_serve_arguments

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)")
    add_serve_arguments(serve, _positive)
    EngineArgs.add_cli_args(serve.add_argument_group("engine"))

    i = sub.add_parser("info", help="model configuration, parameter counts, FLOPs and KV bytes per token, "
                                    "CPU ISA level")
    i.add_argument("--context", type=_positive(int), default=4096, help="context length for FLOPs/token (4096)")
    EngineArgs.add_cli_args(i, only=("model", "dtype", "tp", "moe_parallel", "dequantize", "quantize"))
    return parser


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = [_utf8("--prompt", p) for p in args.prompt]
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.exists():
            raise UsageError(f"--prompts-file {path} does not exist")
        if not path.is_file():
            raise UsageError(f"--prompts-file {path} is not a regular file")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"--prompts-file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                             f"{e.start})") from None
        except OSError as e:
            raise UsageError(f"--prompts-file {path}: {e.strerror}") from None
        prompts += [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UsageError("give at least one --prompt or a --prompts-file")
    if args.system is not None and not args.chat:
        raise UsageError("--system needs --chat")
    if args.system is not None:
        _utf8("--system", args.system)
    for stop in args.stop:
        _utf8(SamplingParams.cli_flags()["stop"], stop)
    return prompts


def _peak_memory(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (cuda max allocated)"
    import resource

    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (peak RSS)"


def _generate(args: argparse.Namespace) -> int:
    prompts = _read_prompts(args)
    params = SamplingParams.from_cli_args(args)  # each value was checked when parsed
    parallel, device = init_parallel(args)
    try:
        with _rank_output(parallel):
            return _generate_on(args, prompts, params, parallel, device)
    finally:
        destroy_parallel(parallel)


@contextlib.contextmanager
def _rank_output(parallel: ParallelContext | None) -> Iterator[None]:
    """Tensor parallel: ranks other than 0 print nothing on stdout (their errors still reach stderr,
    prefixed by the rank)."""
    if parallel is None or parallel.is_first:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _generate_on(args: argparse.Namespace, prompts: list[str], params: SamplingParams,
                 parallel: ParallelContext | None, device: str) -> int:
    from .llm import LLM

    quiet = parallel is not None and not parallel.is_first
    prefix = f"mistral-kernels[rank {parallel.rank}]" if parallel is not None else "mistral-kernels"
    try:
        llm = LLM(**{**EngineArgs.from_cli_args(args).to_llm_kwargs(), "device": device}, parallel=parallel,
                  progress=not quiet)
    except (RuntimeError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"{prefix}: cannot load the model: {e}", file=sys.stderr)
        return 2
    try:
        if len(prompts) == 1:
            for piece in llm.stream(prompts[0], params, chat=args.chat, system=args.system):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            done = [llm.last_completion]
            _print_logprobs(done[0])
        else:
            done = llm.generate(prompts, params, chat=args.chat, system=args.system)
            for n, (p, c) in enumerate(zip(prompts, done)):
                print(f"=== [{n}] {p}")
                print(c.text)
                print(f"--- finish={c.finish_reason} stop={c.stop_reason!r} tokens={len(c.token_ids)} "
                      f"ttft={c.timings.time_to_first_token or 0:.3f}s total={c.timings.total or 0:.3f}s")
                _print_logprobs(c)
    except ValueError as e:
        print(f"{prefix}: {e}", file=sys.stderr)
        return 2
    if quiet:
        return 0
    s = llm.engine.stats
    tp = f" | tp {parallel.world_size} (per-rank peak mem)" if parallel is not None else ""
    print(f"[stats] load {llm.load_seconds:.2f} s | prompt {s.prompt_tokens} tok {s.prompt_tok_per_s:.1f} tok/s | "
          f"decode {s.decode_tokens} tok {s.decode_tok_per_s:.1f} tok/s | {s.decode_gb_per_s:.2f} GB/s | "
          f"{prefix_cache_stats(llm.engine)} | peak mem {_peak_memory(device)} | requests {len(done)} "
          f"preemptions {s.preemptions}{speculative_stats(llm.engine)}{tp}",
          file=sys.stderr)
    return 0


def _print_logprobs(c: Completion) -> None:
    """With ``--logprobs K``: one line per generated token, ``logprob token_id [top: id logprob, ...]``."""
    for lp in c.logprobs or ():
        top = ", ".join(f"{t} {v:.4f}" for t, v in lp.top)
        print(f"--- logprob {lp.logprob:.4f} token {lp.token_id}" + (f" [top: {top}]" if top else ""))


def _info(args: argparse.Namespace) -> int:
    if args.model is None:
        from .default_model import default_model_path

        path = default_model_path()
    else:
        path = Path(args.model)
    from .checkpoint import Checkpoint

    try:
        ckpt = Checkpoint.open(path)
    except (ValueError, FileNotFoundError) as e:
        print(f"mistral-kernels: {e}", file=sys.stderr)
        return 2
    with ckpt:
        return _print_info(args, ckpt)


def _print_info(args: argparse.Namespace, ckpt: Checkpoint) -> int:
    path, c = ckpt.path, ckpt.config
    try:
        dtype = torch_dtype(args.dtype) or ckpt.default_dtype()
    except ValueError as e:
        print(f"mistral-kernels: {e}", file=sys.stderr)
        return 2
    elem = dtype.itemsize
    total, active = c.num_parameters(), c.num_parameters(active_only=True)
    kv = c.kv_bytes_per_token(dtype)
    print(f"model: {path}")
    for key, value in vars(c).items():
        print(f"  {key}: {value}")
    print(f"parameters: total {total:,} ({total / 1e9:.3f} B), active per token {active:,} ({active / 1e9:.3f} B)")
    name = str(dtype).removeprefix("torch.")
    try:
        footprint = ckpt.footprint(dtype, quantized=not args.dequantize, quantize=args.quantize)
    except ValueError as e:
        print(f"mistral-kernels: {e}", file=sys.stderr)
        return 2
    print("stored formats: " + _format_table(footprint.stored))
    print(f"weights as loaded: {footprint.bytes / 2**30:.3f} GiB, {footprint.bytes / max(1, total):.3f} bytes per "
          f"parameter: " + _format_table(footprint.loaded))
    print(f"weights dequantized: {total * elem / 2**30:.3f} GiB in {name}")
    print(f"FLOPs per token: {c.flops_per_token(1):,} at context 1, {c.flops_per_token(args.context):,} at "
          f"context {args.context}")
    window = f" (sliding window {c.sliding_window}: at most {c.sliding_window * kv / 2**20:.1f} MiB per sequence)" \
        if c.sliding_window else ""
    print(f"KV cache: {kv:,} bytes per token in {name}{window}")
    print(_cpu_isa_line())
    if args.tp > 1:
        from .parallel import local_config, parameters_per_rank

        try:
            per_rank = parameters_per_rank(c, args.tp, args.moe_parallel)
        except ValueError as e:
            print(f"mistral-kernels: {e}", file=sys.stderr)
            return 2
        kv_rank = local_config(c, 0, args.tp, args.moe_parallel).kv_bytes_per_token(dtype)
        moe = f", {args.moe_parallel}-parallel experts" if c.is_moe else ""
        print(f"tensor parallel {args.tp}{moe}: per rank {per_rank:,} parameters ({per_rank / 1e9:.3f} B), "
              f"{per_rank * elem / 2**30:.3f} GiB in {name}, KV cache {kv_rank:,} bytes per token")
    return 0


def _cpu_isa_line() -> str:
    """``CPU ISA: <level> (...)``: the level the CPU kernels run and how it was chosen (README "CPU ISA levels")."""
    import os

    from ._library import CPU_ISA_LEVELS, cpu_isa, cpu_isa_supported

    supported = ", ".join(lv for lv in CPU_ISA_LEVELS if cpu_isa_supported(lv))
    forced = os.environ.get("MK_CPU_ISA")
    try:
        level = cpu_isa()
    except RuntimeError as e:
        return f"CPU ISA: error: {e}"
    how = f"forced by MK_CPU_ISA={forced}" if forced else "best this CPU supports"
    return f"CPU ISA: {level} ({how}; this CPU: {supported})"


def _format_table(table: dict[str, list[int]]) -> str:
    """``Q4_1 106,168,320 params 0.625 B/param, float32 …`` (formats by bytes, largest first)."""
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])
    return ", ".join(f"{k} {p:,} params {b / 2**20:,.1f} MiB" + (f" ({b / p:.4g} B/param)" if p else "")
                     for k, (p, b) in rows)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """Warnings as one line on stderr, without the source location (they are for users, not developers)."""
    print(f"mistral-kernels: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mistral-kernels`` script."""
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "serve":
            return _serve(args)
        return _info(args)
    except UsageError as e:
        print(f"mistral-kernels: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the engine has aborted the interrupted requests (LLM.generate / stream)
        print("mistral-kernels: interrupted", file=sys.stderr)
        return 130


def _serve(args: argparse.Namespace) -> int:
    try:
        from .serve.server import serve_main
    except ImportError as e:
        print(f"mistral-kernels serve: {e}; install the serve extra: pip install 'mistral-kernels[serve]'",
              file=sys.stderr)
        return 2
    parallel, device = init_parallel(args)
    try:
        return serve_main(args, parallel, device)
    finally:
        destroy_parallel(parallel)


if __name__ == "__main__":
    raise SystemExit(main())
