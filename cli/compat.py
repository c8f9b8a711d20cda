"""``specguard compat TARGET DRAFT``: whether a draft fits a target for speculative decoding in vLLM.
The checks live in ``playbook/compat``; transformers (the ``playbook`` extra) is imported only when
the command runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Check that a draft model (or an EAGLE / EAGLE-3 head, or an MTP module) fits a target for
speculative decoding in vLLM, before a server refuses it at start-up or, worse, serves it with
an acceptance near zero. Compared: the tokenizers (the token<->id map and the merges, the special
and added tokens, the chat template's own tokens, normalizer and pre-tokenizer, the encodings of
built-in samples in several scripts, code, emoji, numbers and whitespace runs, and of your --texts,
and whether the target's ids decode to the same text with the draft's tokenizer), the chat
template (one conversation rendered by both), and config.json (vocab_size as vLLM compares it,
max positions, rope; an EAGLE-3 head's reduced vocabulary through d2t/t2d).

MODEL is a local directory, or a Hugging Face hub id found in the local cache; nothing is
downloaded unless --allow-download (and HF_HUB_OFFLINE=1 forbids even that).

Exit status: 0 every check ok, 1 warnings, 2 incompatible; 2 too for input that cannot be used
(a path that is not a model, an unreadable file, a bad --texts file), said in one line beginning
"specguard compat: error:". Needs transformers: pip install 'specguard[playbook]'.
"""

EPILOG = """\
examples:
  specguard compat meta-llama/Llama-3.1-8B-Instruct meta-llama/Llama-3.2-1B-Instruct
  specguard compat /models/target /models/draft --texts my_traffic.txt
  specguard compat /models/target /models/eagle3-head --method eagle3 --json
"""


def add_parser(sub: Any) -> None:
    from specguard.playbook.compat.method import METHODS

    parser = sub.add_parser(
        "compat",
        help="check that a draft model (or EAGLE / MTP head) fits a target: tokenizers, chat template, config",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="TARGET", help="the target model: a directory or a cached hub id")
    parser.add_argument(
        "draft", metavar="DRAFT", help="the draft model or head: a directory or a cached hub id"
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        help="the kind of draft, as vLLM's speculative config names it (default: from the draft's "
        "config.json and name, else draft_model)",
    )
    parser.add_argument(
        "--texts",
        type=Path,
        metavar="FILE",
        help="your own texts to encode too: one per line, or a .jsonl/.json prompt file as bench reads",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--allow-download",
        action="store_true",
        help="fetch a hub id's config and tokenizer files when they are not in the local cache",
    )


def cmd_compat(args: argparse.Namespace) -> int:
    from specguard.playbook.compat import loading, render, run, samples

    try:
        texts = samples.builtin_samples()
        if args.texts is not None:
            texts += samples.read_texts(args.texts)
        report = run.compare(args.target, args.draft, texts, args.method, args.allow_download)
    except loading.MissingExtra as err:
        return _error(str(err))
    except samples.TextsError as err:
        return _error(f"--texts {err}")
    except loading.InputError as err:
        return _error(str(err))
    if args.json:
        print(json.dumps(render.to_json(report), indent=2, ensure_ascii=False))
    else:
        print(render.table(report))
    return report.exit_code


def _error(message: str) -> int:
    print(f"specguard compat: error: {message}", file=sys.stderr)
    return 2
