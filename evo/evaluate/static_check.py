"""Refuse an LLM-written patch before it is compiled: the only thing a patch may become is device code inside the
region it names, so anything that reaches the host, reads clocks, or writes outside its region is rejected here.

The scan works on what the compiler sees: backslash-newlines are spliced first, comments are dropped and string
literals are kept apart (their decoded, concatenated text is checked as the PTX it becomes). Decisions, each with
its reason:
- `#include`: only headers the template itself includes (re-including them is a no-op); regions need no others.
- Directives: conditionals (balanced inside the region), `#define`/`#undef` of names that nothing outside the region
  mentions (so gene macros and fixed code cannot change), `#pragma unroll`/`nounroll`; anything else (`#line`,
  `#error`, other pragmas, `_Pragma`) is rejected. Stringizing and `##` pasting are rejected: they could assemble a
  forbidden name from harmless pieces. Raw strings, trigraphs and digraphs are rejected: they hide text from a scan.
- Host-side code: `__host__`, `main(`, `extern "C"`, new `__global__` kernels, `<<<` launches, the CUDA runtime
  API, I/O, files, processes, threads and the heap. Device `printf` is legal CUDA but slow noise: rejected.
- Clocks and placement: `%clock*`, `%globaltimer*`, `%pm*` and `clock()`-like names, plus `%smid`/`%nsmid`/
  `%warpid`/`%nwarpid`: they let a kernel behave differently when it is timed or where it lands.
- State that outlives a launch (`__device__`/`__managed__` variables, function-scope `static`): it would let a
  kernel pass the check and then change behaviour while it is timed.
- Brackets must balance in the region and in each branch of a conditional, so no edit closes an enclosing scope;
  braces in inline asm must balance too, and PTX module directives (.entry, .func, .visible ...) are refused.
- The region markers, control characters and Unicode format characters (bidi overrides hide code from a reader)
  are refused anywhere, and a region body is at most MAX_REGION_BYTES.
The SASS scan in gpu.timer_reads is the backstop for whatever text trick this misses.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from ..regions import REGION, PatchError, apply_patch
from ..types import Candidate, EvalResult, Status

MAX_REGION_BYTES = 16 * 1024          # the template's largest region is under 3 KB
MARKERS = ("KF-EDIT-BEGIN", "KF-EDIT-END")
CONDITIONALS = {"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif"}
HOST_NAMES = {
    "__host__", "__global__", "__managed__", "_Pragma", "printf", "vprintf", "fprintf", "sprintf", "snprintf",
    "puts", "putchar", "cout", "cerr", "clog", "cin", "iostream", "fstream", "ifstream", "ofstream", "fopen",
    "fclose", "fread", "fwrite", "fputs", "fgets", "fflush", "remove", "rename", "unlink", "system", "popen",
    "pclose", "fork", "execl", "execlp", "execv", "execve", "execvp", "getenv", "setenv", "exit", "abort",
    "dlopen", "dlsym", "mmap", "socket", "syscall", "thread", "jthread", "mutex", "async", "malloc", "calloc",
    "realloc", "free", "new", "delete",
}
# C++ names only matter when they name an intrinsic (clock, clock64, chrono clocks); SM and warp ids are
# reachable only through PTX strings, so a local variable called warpid stays legal.
TIMER_NAME = re.compile(r"clock|globaltimer", re.I)
PTX_TIMER = re.compile(r"%\s*(clock\w*|globaltimer\w*|n?smid|n?warpid|pm\d\w*)")
PTX_MODULE = re.compile(r"\.(entry|func|visible|extern|weak|file|loc|section|version|target|address_size|pragma|"
                        r"maxnreg|maxntid|reqntid|minnctapersm|maxclusterrank|reqnctapercluster|alias)\b")
TOKEN = re.compile(r"""(?P<nl>\n)|(?P<ws>[ \t\r\f\v]+)|(?P<lc>//[^\n]*)|(?P<bc>/\*.*?\*/)|(?P<open>/\*)
    |(?P<raw>(?:u8|u|U|L)?R")|(?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")|(?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')
    |(?P<num>\.?\d(?:[eEpP][+-]|'?[\w.])*)|(?P<id>[A-Za-z_]\w*)
    |(?P<bad><%|%>|%:|<:|:>|\?\?[=/'()!<>-])|(?P<punct>\#\#|<<<|::|.)""", re.S | re.X)
PAIRS = {")": "(", "]": "[", "}": "{"}
ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]*|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[0-7]{1,3}|.)", re.S)


class Reject(Exception):
    """Internal: the first reason found; check() turns it into its return value."""


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int


def screen(template: str, patch: Mapping[str, str]) -> tuple[Status, str] | None:
    """The evaluators' gate: (invalid_patch | rejected, message) for a patch that must not be compiled, else None."""
    if not patch:
        return None
    try:
        reason = check(template, patch)
    except PatchError as exc:
        return Status.INVALID_PATCH, str(exc)
    return (Status.REJECTED, f"static check: {reason}") if reason else None


def refusals(template: str, candidates: Sequence[Candidate], evaluator: str) -> dict[str, EvalResult]:
    """Results for the candidates whose patch must not be compiled (invalid_patch or rejected), by candidate id."""
    out = {}
    for cand in candidates:
        refused = screen(template, cand.genome.patch_dict)
        if refused:
            out[cand.id] = EvalResult(cand.id, refused[0], message=refused[1], evaluator=evaluator)
    return out


def check(template: str, patch: Mapping[str, str]) -> str | None:
    """None if the patch is safe to compile, else one line naming what was found and where (region, line).
    A region the template does not have raises PatchError: that is invalid_patch, not rejected."""
    apply_patch(template, dict(patch))
    allowed = {m.group(1) for m in re.finditer(r"^\s*#\s*include\s*([<\"][^>\"]+[>\"])", _fixed(template), re.M)}
    for name, body in sorted(patch.items()):
        outside = apply_patch(template, {**patch, name: ""})
        try:
            _check_region(body, allowed, set(re.findall(r"[A-Za-z_]\w*", outside)))
        except Reject as exc:
            return f"region {name!r}, {exc}"
    return None


def _fixed(template: str) -> str:
    """The template without its editable region bodies: the text no patch may change."""
    return REGION.sub(lambda m: m.group(0).split("\n", 1)[0], template)


def _check_region(body: str, includes: set[str], outside_names: set[str]) -> None:
    if len(body.encode()) > MAX_REGION_BYTES:
        raise Reject(f"line 1: the body is {len(body.encode())} bytes, over the {MAX_REGION_BYTES}-byte limit")
    for i, text in enumerate(body.split("\n"), 1):
        for marker in MARKERS:
            if marker in text:
                raise Reject(f"line {i}: contains the region marker {marker}")
        for ch in text:
            if (ord(ch) < 32 and ch not in "\t\r") or unicodedata.category(ch) == "Cf":
                raise Reject(f"line {i}: control or format character U+{ord(ch):04X}")
    lines = list(_logical_lines(_tokens(body)))
    _check_directives(lines, includes, outside_names)
    _check_names([t for line in lines for t in line if t.kind == "id"])
    _check_code([t for line in lines if not _is_directive(line) for t in line])
    _check_brackets(lines)
    _check_strings([t for line in lines for t in line if t.kind == "str"])


def _tokens(body: str) -> Iterator[Tok]:
    """Tokens after line splicing; comments vanish (a block comment never ends a line, as in the compiler)."""
    text, where = _splice(body)
    for m in TOKEN.finditer(text):
        kind, at = m.lastgroup, where[m.start()]
        if kind in ("ws", "lc", "bc"):
            continue
        if kind == "open":
            raise Reject(f"line {at}: unterminated comment")
        if kind == "raw":
            raise Reject(f"line {at}: raw string literal (not needed in device code, and it hides text)")
        if kind == "bad":
            raise Reject(f"line {at}: trigraph or digraph {m.group()!r}")
        if kind == "punct" and m.group() in "\"'":
            raise Reject(f"line {at}: unterminated literal")
        yield Tok(kind, m.group(), at)


def _splice(body: str) -> tuple[str, list[int]]:
    """Backslash-newline splicing (translation phase 2), with the source line of every character kept."""
    out, where, line = [], [], 1
    for part in re.split(r"(\\[ \t]*\r?\n)", body):
        if part.startswith("\\") and part.endswith("\n"):
            line += 1
            continue
        for ch in part:
            out.append(ch)
            where.append(line)
            line += ch == "\n"
    return "".join(out), where + [line]


def _logical_lines(tokens: Iterator[Tok]) -> Iterator[list[Tok]]:
    line: list[Tok] = []
    for tok in tokens:
        if tok.kind == "nl":
            if line:
                yield line
            line = []
        else:
            line.append(tok)
    if line:
        yield line


def _is_directive(line: list[Tok]) -> bool:
    return line[0].text == "#"


def _check_directives(lines: list[list[Tok]], includes: set[str], outside_names: set[str]) -> None:
    for line in filter(_is_directive, lines):
        at = line[0].line
        name = line[1].text if len(line) > 1 else ""
        rest = [t.text for t in line[2:]]
        if name in CONDITIONALS:
            continue
        if name == "include":
            header = "".join(rest)
            if header not in includes:
                raise Reject(f"line {at}: #include {header} is not allowed (allowed: {sorted(includes) or 'none'})")
        elif name in ("define", "undef"):
            macro = rest[0] if rest else ""
            if macro in outside_names:
                raise Reject(f"line {at}: #{name} {macro} would change code outside the region")
            if name == "define" and any(t in ("#", "##") for t in rest):
                raise Reject(f"line {at}: #define {macro} uses stringizing or token pasting")
        elif name == "pragma":
            if not rest or rest[0] not in ("unroll", "nounroll"):
                raise Reject(f"line {at}: #pragma {' '.join(rest)} (only unroll / nounroll are allowed)")
        else:
            raise Reject(f"line {at}: directive #{name} is not allowed")


def _check_names(names: list[Tok]) -> None:
    """Host code, clocks and the runtime API by name, in directives too (a macro could spell them otherwise)."""
    for tok in names:
        if tok.text in HOST_NAMES:
            raise Reject(f"line {tok.line}: {tok.text} (host-side or not allowed in device code)")
        if TIMER_NAME.search(tok.text):
            raise Reject(f"line {tok.line}: {tok.text} (clocks and timers are not allowed)")
        if re.match(r"cuda[A-Z]", tok.text):
            raise Reject(f"line {tok.line}: {tok.text} (CUDA runtime API)")


def _check_code(tokens: list[Tok]) -> None:
    """Shapes of host code and of state that outlives a launch, in code outside directives."""
    for i, tok in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else Tok("end", "", tok.line)
        if tok.text in ("#", "##"):
            raise Reject(f"line {tok.line}: stray {tok.text} outside a directive")
        if tok.text == "<<<":
            raise Reject(f"line {tok.line}: kernel launch <<<")
        if (tok.text, after.text) == ("main", "(") or (tok.text, after.kind) == ("extern", "str"):
            raise Reject(f"line {tok.line}: {tok.text} {after.text} (host-side code)")
        if tok.text == "__device__" and _declares_variable(tokens[i + 1:]):
            raise Reject(f"line {tok.line}: __device__ variable (state that persists across launches)")
        if tok.text == "static" and _declares_variable(tokens[i + 1:], ("const", "constexpr", "__shared__")):
            raise Reject(f"line {tok.line}: static variable (state that persists across launches)")


def _declares_variable(tokens: list[Tok], exempt: tuple[str, ...] = ()) -> bool:
    """After a storage specifier: a variable unless a `(` (a function) or an exempt word comes first."""
    for tok in tokens:
        if tok.text in exempt or tok.text == "(":
            return False
        if tok.text in (";", "=", "[", "{", ","):
            return True
    return True


def _check_brackets(lines: list[list[Tok]]) -> None:
    """Balanced in the region and within each branch of a conditional; a #define body balanced on its own."""
    stack: list[str] = []
    saved: list[list[str]] = []
    for line in lines:
        if _is_directive(line):
            name = line[1].text if len(line) > 1 else ""
            if name in ("if", "ifdef", "ifndef"):
                saved.append(list(stack))
            elif name in CONDITIONALS:
                if not saved:
                    raise Reject(f"line {line[0].line}: #{name} without its #if in the region")
                if stack != saved[-1]:
                    raise Reject(f"line {line[0].line}: brackets are unbalanced in a branch before #{name}")
                if name == "endif":
                    saved.pop()
            elif name == "define":
                own: list[str] = []
                _balance(line[3:], own)
                if own:
                    raise Reject(f"line {line[0].line}: unclosed {own[-1]!r} in #define")
            continue
        _balance(line, stack)
    if saved:
        raise Reject("end: #if without #endif in the region")
    if stack:
        raise Reject(f"end: unclosed {stack[-1]!r}")


def _balance(tokens: list[Tok], stack: list[str]) -> None:
    for tok in tokens:
        if tok.text in "([{" and tok.kind == "punct":
            stack.append(tok.text)
        elif tok.text in PAIRS and tok.kind == "punct":
            if not stack or stack.pop() != PAIRS[tok.text]:
                raise Reject(f"line {tok.line}: {tok.text!r} closes a bracket the region did not open")


def _check_strings(strings: list[Tok]) -> None:
    """String literals become PTX: no timers, no module-level directives, balanced braces. The pieces are joined,
    so a name split over adjacent literals ("%glob" "altimer") is still found."""
    if not strings:
        return
    joined = "".join(_literal(t.text) for t in strings)
    for pattern, what in ((PTX_TIMER, "reads a clock, timer or SM id"), (PTX_MODULE, "PTX module directive")):
        m = pattern.search(joined)
        if m:
            where = next((t.line for t in strings if m.group().lstrip("%. ") in t.text), strings[0].line)
            raise Reject(f"line {where}: string {m.group()!r}: {what}")
    depth = 0
    for ch in joined:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            raise Reject(f"line {strings[0].line}: a '}}' in inline asm closes a PTX scope it did not open")
    if depth:
        raise Reject(f"line {strings[0].line}: unbalanced braces in inline asm")


def _literal(text: str) -> str:
    """A string literal's value, escapes decoded, so that "%\\x63lock" is seen as the %clock it becomes."""
    inner = text[text.index('"') + 1:-1]
    return ESCAPE.sub(lambda m: _unescape(m.group(1)), inner)


def _unescape(esc: str) -> str:
    if esc[0] in "xuU":
        return chr(min(int(esc[1:] or "0", 16), 0x10FFFF))
    if esc[0] in "01234567":
        return chr(int(esc, 8))
    return {"n": "\n", "t": "\t", "r": "\r"}.get(esc, esc)
