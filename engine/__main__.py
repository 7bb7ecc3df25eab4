"""`python -m engine bench|serve-trace|roofline|generate ...`: the real engine's command line."""
from __future__ import annotations

import sys
from pathlib import Path

from core.cli import ArgumentParser, run_subcommand


def roofline_main(argv: list[str]) -> int:
    from core.config import PRESETS, resolve_model
    from core.roofline import GPUS, get_gpu, roofline

    p = ArgumentParser(prog="python -m engine roofline",
                       description="The five roofline numbers for a model on a GPU, from specs alone.")
    p.add_argument("--model", default="qwen2.5-1.5b", help=f"preset ({', '.join(PRESETS)}), a Hugging Face config.json or a checkpoint directory")
    p.add_argument("--gpu", default="all", help=f"GPU preset ({', '.join(GPUS)}) or 'all' (default)")
    p.add_argument("--dtype-bytes", type=int, default=2, help="bytes per weight (default 2: fp16)")
    try:
        args = p.parse_args(argv)
        model = resolve_model(args.model)
        gpus = list(GPUS) if args.gpu == "all" else [args.gpu]
        for g in gpus:
            print(roofline(model, get_gpu(g), args.dtype_bytes).table())
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def generate_main(argv: list[str]) -> int:
    from engine.engines import ENGINES, generate
    from engine.prompts import Tokenizer, prompt_ids
    from engine.provenance import resolve_device
    from engine.weights import load_model

    p = ArgumentParser(prog="python -m engine generate", description="Generate greedily and print the text.")
    p.add_argument("--model", default="tiny", help="preset or config.json (random weights), or checkpoint directory (default tiny)")
    p.add_argument("--prompt", default="p64", help="a prompt name (p16...p4096) or literal text")
    p.add_argument("--engine", default="cached", choices=ENGINES)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="auto")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at the end-of-text token")
    try:
        args = p.parse_args(argv)
        checkpoint = args.model if Path(args.model).is_dir() else None
        tok = Tokenizer(checkpoint)
        ids = prompt_ids(args.prompt, checkpoint) if args.prompt.startswith("p") and args.prompt[1:].isdigit() \
            else tok.encode(args.prompt)
        model, weights = load_model(args.model, args.dtype, resolve_device(args.device))
        ids = [t % model.config.vocab_size for t in ids]  # (Qwen2.5 ids, for a preset of another vocabulary)
        run = generate(model, [ids], args.new_tokens, engine=args.engine, stop_at_eos=args.stop_at_eos)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if weights == "random":
        print(f"(note: {args.model} has seeded random weights, so the text is gibberish; "
              "--model DIR loads a real checkpoint)", file=sys.stderr)
    produced = run.request_records()[0].output_tokens
    print(tok.decode(run.tokens[0][:produced]))
    return 0


def bench_main(argv: list[str]) -> int:
    from engine.bench import main
    return main(argv)


def serve_main(argv: list[str]) -> int:
    from engine.serve import main
    return main(argv)


COMMANDS = {"bench": ("closed-run benchmark (TTFT, ITL, tok/s; results/<engine>/runs.jsonl)", bench_main),
            "serve-trace": ("open run: replay a trace in real time on the continuous engine", serve_main),
            "roofline": ("the five roofline numbers for a model on a GPU", roofline_main),
            "generate": ("generate text from a prompt", generate_main)}


def main(argv: list[str] | None = None) -> int:
    """`python -m engine COMMAND ...`: the sub-command's own main runs the rest of the line."""
    return run_subcommand("python -m engine", __doc__, COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
