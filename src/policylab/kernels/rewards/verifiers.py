"""Answer verifiers: turn a model reply and a gold answer into a correctness reward.

Two verifiers:

- `exact_numeric_reward`: the LAST number written in the reply must equal the gold answer
  numerically. This is the rule the base model's reference accuracies were measured
  with ("the last number in the reply must equal the answer"). Pure Python, no dependency.
- `math_verify_reward`: symbolic equivalence through the optional `math-verify` package
  (`pip install 'policylab[math]'`), for LaTeX / expression answers.

Both follow the reward-function protocol of `policylab.kernels.rewards.combine`: they take
`(completions, answers, **context)` and return one float per completion; `prompts` in the
context is read by `exact_numeric_reward` (an echoed prompt is not an answer), anything
else is accepted and ignored.

What a reply cannot do (tests/adversarial/test_text_rewards.py): list several answers (only
the last number counts, so enumerating is worth one guess), hide an answer in a comment or
earlier in the text (likewise), echo the prompt (its numbers are not read), write a digit of
another script (only ASCII digits are digits), a huge number or NaN/inf text (never equal to
a finite gold). A gold answer that is not a finite number (exact) or that math-verify reads
as undefined (zoo, NaN: "\\frac{1}{0}") is a data error and raises, never scores.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from policylab.errors import NonFiniteError, PolicylabError, ShapeError

# A number as written in prose. Pieces, in order:
#   (?<![\d.])          not glued to a preceding digit or dot, so "8-3" reads as 8 and 3
#                       (the "-" is an operator there, not a sign) and "1.2.3" is not re-read
#   ([-+\u2212]?)       optional sign; U+2212 is the typographic minus sign
#   digits are ASCII only (re.ASCII): "٤٢" or "４２" are not numbers, so a reply is read
#                       the same way by the regex and by Decimal
#   (\d{1,3}(?:,\d{3})+(?!\d) | \d+ | (?=\.\d))
#                       thousands-grouped integer ("1,234,567"), plain digits, or nothing
#                       when the number starts at the decimal point (".5")
#   (\.\d+)?            decimal part; a dot not followed by a digit (sentence end) is not taken
_NUMBER = re.compile(
    r"(?<![\d.])([-+\u2212]?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?=\.\d))(\.\d+)?", re.ASCII
)

DEFAULT_REL_TOL = 1e-9
DEFAULT_ABS_TOL = 1e-9


def extract_last_number(text: str) -> str | None:
    """The last number written in `text`, normalized, or None if there is none.

    Normalization: thousands separators removed ("1,234" -> "1234"), a leading "+" dropped,
    the Unicode minus U+2212 turned into "-", a leading-dot decimal gets a 0 (".5" -> "0.5").
    Trailing punctuation is never part of the number ("It is 42." -> "42").
    A "-" directly after a digit is read as an operator, not a sign ("8-3" -> "3").
    Not recognized (by design, kept simple): scientific notation, fractions "1/2" (read as
    the two numbers 1 and 2), spelled-out numbers, digits other than ASCII 0-9. Use
    `math_verify_reward` for those.
    """
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, got {type(text).__name__}")
    last = None
    for last in _NUMBER.finditer(text):
        pass
    if last is None:
        return None
    sign, integer, frac = last.group(1), last.group(2), last.group(3) or ""
    sign = "-" if sign in ("-", "\u2212") else ""
    return f"{sign}{integer.replace(',', '') or '0'}{frac}"


def gold_number(gold: Any) -> Decimal:
    """Gold answer as a finite Decimal; a malformed gold answer is a data bug and raises
    (PolicylabError; NonFiniteError for NaN / inf). Loaders call it on every answer."""
    if isinstance(gold, bool) or not isinstance(gold, (int, float, str, Decimal)):
        raise TypeError(f"gold answer must be an int, float, str or Decimal, got {type(gold).__name__}: {gold!r}")
    if isinstance(gold, float) and not math.isfinite(gold):
        raise NonFiniteError(f"gold answer is not finite: {gold!r}")
    text = repr(gold) if isinstance(gold, float) else str(gold)
    cleaned = text.strip().replace(",", "").replace("\u2212", "-")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise PolicylabError(f"gold answer {gold!r} is not a number") from None
    if not value.is_finite():
        raise NonFiniteError(f"gold answer is not finite: {gold!r}")
    return value


def numeric_match(
    pred: str | None,
    gold: Any,
    *,
    rel_tol: float = DEFAULT_REL_TOL,
    abs_tol: float = DEFAULT_ABS_TOL,
) -> bool:
    """True iff the predicted number equals the gold answer.

    Rule: when both values are integers (after parsing: "42", "42.0" and 42 are the
    integer 42) they must be exactly equal, in arbitrary precision (no float rounding, so
    10**20 + 1 != 10**20). Otherwise they are compared as floats with
    |pred - gold| <= max(rel_tol * max(|pred|, |gold|), abs_tol)  (math.isclose),
    defaults 1e-9 for both, which absorbs binary float noise (gold 0.1 + 0.2 matches "0.3")
    but not any rounding a model might do ("0.33" does not match 1/3).

    `pred` is model output: None or an unparseable string is simply no match (False).
    `gold` is data: an unparseable or non-finite gold answer raises, never scores 0.
    """
    gold_value = gold_number(gold)
    if pred is None:
        return False
    if not isinstance(pred, str):
        raise TypeError(f"`pred` must be a str or None, got {type(pred).__name__}")
    try:
        pred_value = Decimal(pred.strip().replace(",", "").replace("\u2212", "-"))
    except InvalidOperation:
        return False
    if not pred_value.is_finite():
        return False
    if pred_value == pred_value.to_integral_value() and gold_value == gold_value.to_integral_value():
        return pred_value == gold_value
    return math.isclose(float(pred_value), float(gold_value), rel_tol=rel_tol, abs_tol=abs_tol)


def _check_pairs(completions: Sequence[str], answers: Sequence[Any]) -> None:
    if isinstance(completions, str):
        raise TypeError("`completions` must be a list of str, got a single str")
    if len(completions) != len(answers):
        raise ShapeError(
            f"`completions` has {len(completions)} entries but `answers` has {len(answers)}"
        )
    for i, c in enumerate(completions):
        if not isinstance(c, str):
            raise TypeError(f"`completions[{i}]` must be a str, got {type(c).__name__}")


def strip_echo(reply: str, prompt: str | None) -> str:
    """The reply without any verbatim copy of its prompt (an echoed prompt is not an
    answer: its numbers are the question's). Prompts shorter than 8 characters are left
    alone (too short to be an echo rather than an answer)."""
    if not isinstance(prompt, str) or len(prompt.strip()) < 8:
        return reply
    return reply.replace(prompt.strip(), " ")


def exact_numeric_reward(completions: Sequence[str], answers: Sequence[Any], **context: Any) -> list[float]:
    """1.0 if the LAST number in the reply equals the gold answer (`numeric_match`), else 0.0.

    Contract: one answer per reply, the last ASCII-digit number written; a copy of the
    prompt (context `prompts`, when given) is removed first (`strip_echo`). An empty reply
    or a reply without a number scores 0.0 (it is a wrong answer, not a missing one). A
    malformed gold answer raises. Returns one float per completion `[B]`.
    """
    _check_pairs(completions, answers)
    prompts = context.get("prompts")
    if prompts is None or len(prompts) != len(completions):
        prompts = [None] * len(completions)
    return [float(numeric_match(extract_last_number(strip_echo(c, p)), a))
            for c, a, p in zip(completions, answers, prompts)]


def _math_verify():
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise ImportError(
            "math_verify_reward needs the optional `math-verify` package: "
            "pip install 'policylab[math]'"
        ) from exc
    return parse, verify


def math_gold(answer: Any) -> list:
    """math-verify's reading of a gold answer; refuses (PolicylabError) a gold it cannot
    parse, even wrapped in $...$, and one whose value is undefined: complex infinity or
    NaN after evaluation ("\\frac{1}{0}", "0/0", "\\log(0)"), which would make a reply
    that writes the same undefined expression correct. Loaders call it on every answer."""
    parse, _ = _math_verify()
    if isinstance(answer, float) and not math.isfinite(answer):
        raise NonFiniteError(f"gold answer is not finite: {answer!r}")
    gold = parse(str(answer)) or parse(f"${answer}$")
    if not gold:
        raise PolicylabError(f"math-verify cannot parse gold answer {answer!r}")
    import sympy

    for g in gold:
        if isinstance(g, sympy.Basic):
            try:
                value = g.doit()
            except Exception:  # noqa: BLE001  (sympy raises many types; an unevaluable gold is undefined)
                value = sympy.nan
            if isinstance(value, sympy.Basic) and value.has(sympy.zoo, sympy.nan):
                raise PolicylabError(f"gold answer {answer!r} is undefined (math-verify reads it as {value}): "
                                     "no reply may be scored against it")
    return gold


def math_verify_reward(completions: Sequence[str], answers: Sequence[Any], **_context: Any) -> list[float]:
    """1.0 if `math-verify` judges the reply equivalent to the gold answer, else 0.0.

    Uses `math_verify.parse` on both sides and `math_verify.verify(gold, pred)` (gold
    first: the check is not symmetric). Unlike `exact_numeric_reward`, math-verify picks
    the answer by its own extraction rules (boxed answers and LaTeX first), not "the last
    number". Contract: an empty reply scores 0.0; a gold answer that `math_gold` refuses
    (unparseable, or undefined such as \\frac{1}{0}) raises, naming the sample.
    math-verify enforces its parse timeout with signals, so call this from the main thread.
    """
    parse, verify = _math_verify()
    _check_pairs(completions, answers)
    rewards = []
    for i, (completion, answer) in enumerate(zip(completions, answers)):
        try:
            gold = math_gold(answer)
        except PolicylabError as exc:
            raise type(exc)(f"{exc} (sample {i})") from None
        pred = parse(completion) if completion.strip() else []
        rewards.append(float(bool(pred) and verify(gold, pred)))
    return rewards
