"""The learning layer's subcommands for `policylab`:

    policylab quiz [-n N] [--method NAME] [--topic T] [--category C] [--lang en|zh] [--seed S]
                                                               a round of N questions: answers on
                                                               stdin, a score, a review of the missed
    policylab explain NAME [--lang en|zh] [--plot FILE]        card, formulas, worked examples of a
                                                               method, metric or literature-only card
                                                               (any case); --plot writes the method's
                                                               figure (.svg, .png or .pdf), its path
                                                               checked before anything is printed
    policylab site build OUT_DIR [--allow-incomplete]          the static site (offline, file://)

`policylab.cli.build_parser` calls `add_subcommands(sub)`. Errors are PolicylabError
(UnknownMethodError, BankError), which the main CLI prints as `policylab: error: ...`.
"""

from __future__ import annotations

import argparse

LANG_CHOICES = ("en", "zh")


def _quiz(args) -> int:
    from policylab.learn.quiz import quiz_round

    quiz_round(args.n, args.method, args.lang, args.seed, topic=args.topic, category=args.category)
    return 0


def _explain(args) -> int:
    from policylab.learn.quiz import check_plot, explain

    if args.plot:  # the output path, the subject's figure and the fonts, before any work
        check_plot(args.name, args.plot, args.lang)
    explain(args.name, args.lang)
    if args.plot:
        from policylab.learn.quiz import write_plot

        write_plot(args.name, args.plot, args.lang)
    return 0


SITE_MARKER = ".policylab-site"
SITE_PAGES = ("index.html", "compare.html", "topics.html")  # a site built before the marker existed has these


def check_site_dir(out_dir, *, overwrite: bool) -> None:
    """Refuse (PolicylabError, nothing written) an OUT_DIR that is a file, or a non-empty
    directory that is not a previous site build (no marker, not the site's pages) unless
    `overwrite`; a link or special file where a page goes is refused."""
    from pathlib import Path

    from policylab.errors import PolicylabError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PolicylabError(f"site build {out}: it exists and is not a directory (nothing was written)")
    if not out.is_dir():
        return
    have = {p.name for p in out.iterdir()}
    previous = SITE_MARKER in have or set(SITE_PAGES) <= have
    if have and not previous and not overwrite:
        shown = ", ".join(sorted(have)[:4]) + (" ..." if len(have) > 4 else "")
        raise PolicylabError(f"site build {out}: the directory holds files that are not a policylab site ({shown}); "
                             "the build would replace any with a page's name. Choose an empty or new directory, or "
                             "pass --overwrite (nothing was written)")
    for name in SITE_PAGES:
        p = out / name
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise PolicylabError(f"site build {out}: {p} is not a plain file (a link or a folder); nothing was written")


def _site_build(args) -> int:
    from pathlib import Path

    from policylab.learn.site import build_site

    check_site_dir(args.out_dir, overwrite=args.overwrite)
    index = build_site(args.out_dir, complete=not args.allow_incomplete)
    (Path(args.out_dir) / SITE_MARKER).write_text("a policylab site build (policylab site build)\n")
    print(f"wrote {index} (open it in a browser; it works offline from file://)")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add `quiz`, `explain` and `site` to the subparsers of the main CLI."""
    q = sub.add_parser("quiz", help="a round of questions from the bank: answer, check, score, review")
    q.add_argument("-n", type=int, default=5, help="questions in the round (default 5)")
    q.add_argument("--method", help="ask only about this method, metric or literature-only card (any case)")
    q.add_argument("--topic", help="ask only about the methods of a reading-order topic (part of its title)")
    q.add_argument("--category", choices=("basics", "mechanism", "comparison", "implementation"))
    q.add_argument("--lang", choices=LANG_CHOICES, default="en")
    q.add_argument("--seed", type=int, default=None, help="seed of the random choice (default: random)")
    q.set_defaults(fn=_quiz)
    e = sub.add_parser("explain", help="a method's card, formulas and worked examples with live numbers")
    e.add_argument("name")
    e.add_argument("--lang", choices=LANG_CHOICES, default="en")
    e.add_argument("--plot", metavar="FILE", help="also write the method's figure, the one on its site page, "
                   "computed now by its kernels (.svg, .png or .pdf; labels in --lang)")
    e.set_defaults(fn=_explain)
    s = sub.add_parser("site", help="the static method explorer")
    ssub = s.add_subparsers(dest="site_cmd", required=True)
    b = ssub.add_parser("build", help="write the static site into OUT_DIR")
    b.add_argument("out_dir")
    b.add_argument("--allow-incomplete", action="store_true",
                   help="build even if some methods have no bank file yet (a preview)")
    b.add_argument("--overwrite", action="store_true",
                   help="build into a non-empty directory that is not a previous site build (its files with a page's "
                        "name are replaced)")
    b.set_defaults(fn=_site_build)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m policylab.learn.cli ...`), same handling as policylab.cli."""
    import sys

    from policylab.errors import PolicylabError

    p = argparse.ArgumentParser(prog="policylab")
    add_subcommands(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (PolicylabError, FileNotFoundError, ImportError) as exc:
        print(f"policylab: error: {' '.join(str(exc).split()) if args.cmd == 'quiz' else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("policylab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
