"""WebRL's action grammar (the official one: VAB-WebArena-Lite ``new/actions.py``, which replaces WebArena's
``browser_env/actions.py``; its ``create_webrl_id_based_action`` and ``execute_action_webrl``): parsing with
``ast`` and execution with Playwright locators.

Grammar: optional comment lines (``# Element: ...``, ``# Note: ...``) and then one call among

    do(action="Click"|"Right Click"|"Hover", element="N")
    do(action="Type"|"Search", argument="text", element="N")
    do(action="Select Dropdown Option", argument="option text", element="N")
    do(action="Scroll Up"|"Scroll Down"|"Press Enter"|"Go backward"|"Go forward"|"Wait")
    do(action="Switch Tab", argument="tab index")
    exit(message="answer")
    go_backward()   go_forward()

Parsing: the text from the LAST occurrence of a keyword that parses is taken (a keyword inside an earlier
string, e.g. ``exit(message="... do(x)")``, is tried after the later one fails); the call must have keyword
arguments with literal values (``ast.literal_eval``; model output is never evaluated). Action names are
matched case-insensitively and written canonically.

Execution (fixes of the official executor, ``execute_action_webrl``): the element is found live by its
``data-label-id`` with a Playwright locator (Playwright's actionability checks instead of a blind click at
cached coordinates); Type clears the field with ControlOrMeta+A + Backspace before typing
(``type_replaces=False`` reproduces the official Meta+A, which only deletes one character on Linux);
Search = Type + Enter (no 2 s sleep: the next observation waits for the page to settle); Scroll moves
the window (or the largest scrollable box when the window cannot scroll) by 2/3 of the viewport height.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field

DO_ACTIONS = ["Click", "Right Click", "Type", "Search", "Hover", "Scroll Up", "Scroll Down", "Press Enter",
              "Select Dropdown Option", "Go backward", "Go forward", "Wait", "Switch Tab"]
ELEMENT_ACTIONS = {"Click", "Right Click", "Type", "Search", "Hover", "Select Dropdown Option"}
ARGUMENT_ACTIONS = {"Type", "Search", "Select Dropdown Option"}
_CANON = {a.lower().replace(" ", ""): a for a in DO_ACTIONS}
_CANON.update({"gobackward": "Go backward", "goback": "Go backward", "goforward": "Go forward",
               "scrollup": "Scroll Up", "scrolldown": "Scroll Down", "selectoption": "Select Dropdown Option",
               "selectdropdownoption": "Select Dropdown Option", "enter": "Press Enter"})
_KEYWORD = re.compile(r"(?<![\w.])(do|exit|go_backward|go_forward)\s*\(")


class ActionParseError(ValueError):
    """The response is not a valid action; the message says why (shown to the agent on the next step)."""


@dataclass
class Action:
    name: str                      # canonical: one of DO_ACTIONS, or "exit"
    argument: str | None = None
    element: str | None = None
    message: str | None = None     # exit's answer
    comments: list[str] = field(default_factory=list)

    def key(self) -> tuple:
        """Identity for repeat detection (comments ignored)."""
        return (self.name, self.argument, self.element, self.message)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    def __str__(self) -> str:
        if self.name == "exit":
            return f"exit(message={self.message!r})"
        args = [f"action={self.name!r}"]
        if self.argument is not None:
            args.append(f"argument={self.argument!r}")
        if self.element is not None:
            args.append(f"element={self.element!r}")
        return f"do({', '.join(args)})"


def _clean_tail(text: str) -> str:
    text = text.replace("<|eot_id|>", "").strip()
    text = re.sub(r"```\s*$", "", text).strip()
    return text


def _literal(node: ast.AST, what: str):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise ActionParseError(f"{what} must be a literal string, got {ast.unparse(node)!r}") from None


def _call_from(text: str) -> ast.Call:
    """Parse the first complete call in ``text`` (the whole rest, else its first line)."""
    candidates = [_clean_tail(text)]
    first_line = text.split("\n", 1)[0]
    if first_line != text:
        candidates.append(_clean_tail(first_line))
    err = None
    for cand in candidates:
        try:
            tree = ast.parse(cand, mode="eval")
        except SyntaxError as e:
            err = e
            continue
        if isinstance(tree.body, ast.Call) and isinstance(tree.body.func, ast.Name):
            return tree.body
        err = SyntaxError("not a single function call")
    raise ActionParseError(f"cannot parse {candidates[-1][:120]!r}: {err.msg if err else 'no call'}")


def _build(call: ast.Call, comments: list[str]) -> Action:
    fn = call.func.id
    kwargs = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionParseError("**kwargs are not allowed in an action")
        kwargs[kw.arg] = _literal(kw.value, kw.arg)
    if fn in ("go_backward", "go_forward"):
        if call.args or kwargs:
            raise ActionParseError(f"{fn}() takes no arguments")
        return Action(name="Go backward" if fn == "go_backward" else "Go forward", comments=comments)
    if fn == "exit":
        if call.args:  # exit("answer") is accepted as exit(message="answer")
            if len(call.args) > 1 or "message" in kwargs:
                raise ActionParseError("exit takes one argument: message")
            kwargs["message"] = _literal(call.args[0], "message")
        extra = set(kwargs) - {"message"}
        if extra:
            raise ActionParseError(f"exit got unknown argument(s) {sorted(extra)}; allowed: message")
        msg = kwargs.get("message", "")
        return Action(name="exit", message="" if msg is None else str(msg), comments=comments)
    # do(...)
    if call.args:
        raise ActionParseError('do() needs keyword arguments: do(action="...", argument="...", element="...")')
    extra = set(kwargs) - {"action", "argument", "element"}
    if extra:
        raise ActionParseError(f"do got unknown argument(s) {sorted(extra)}; allowed: action, argument, element")
    raw = kwargs.get("action")
    if not isinstance(raw, str):
        raise ActionParseError(f"do() needs action=<one of {DO_ACTIONS}>")
    name = _CANON.get(raw.lower().replace(" ", "").replace("_", ""))
    if name is None:
        raise ActionParseError(f"unknown action {raw!r}; allowed: {DO_ACTIONS}")
    element = kwargs.get("element")
    if isinstance(element, bool) or (element is not None and not isinstance(element, (int, str))):
        raise ActionParseError(f"element must be an id like \"12\", got {element!r}")
    element = None if element is None else str(element).strip()
    if name in ELEMENT_ACTIONS:
        if not element:
            raise ActionParseError(f'{name} needs element="<id>"')
        if not element.isdigit():
            raise ActionParseError(f"element must be a numeric id, got {element!r}")
    argument = kwargs.get("argument")
    if argument is not None and not isinstance(argument, (str, int, float)):
        raise ActionParseError(f"argument must be a string, got {argument!r}")
    argument = None if argument is None else str(argument)
    if name in ARGUMENT_ACTIONS and argument is None:
        raise ActionParseError(f'{name} needs argument="..."')
    return Action(name=name, argument=argument, element=element, comments=comments)


def parse_action(text: str) -> Action:
    """Parse one model response into an ``Action`` (raises ``ActionParseError`` with the reason)."""
    if not isinstance(text, str) or not text.strip():
        raise ActionParseError("empty response; expected do(...), exit(...), go_backward() or go_forward()")
    matches = list(_KEYWORD.finditer(text))
    if not matches:
        raise ActionParseError("no action found; expected do(...), exit(...), go_backward() or go_forward()")
    first_err: ActionParseError | None = None
    for m in reversed(matches):
        try:
            call = _call_from(text[m.start():])
        except ActionParseError as e:
            first_err = first_err or e
            continue
        comments = [ln.strip() for ln in text[:m.start()].splitlines() if ln.strip().startswith("#")]
        return _build(call, comments)
    raise first_err


# ---------------------------------------------------------------------------------------------
# execution

class ActionError(RuntimeError):
    """The action was valid but could not be carried out on this page (shown to the agent next step)."""


_CRASH_MARKERS = ("Target crashed", "Target page, context or browser has been closed", "Browser has been closed",
                  "browser has disconnected", "Connection closed", "Page crashed", "context or browser has been closed")


def is_crash(exc: BaseException) -> bool:
    """True when an exception means the page/browser is gone (restart), not that the action failed."""
    return any(m.lower() in str(exc).lower() for m in _CRASH_MARKERS)


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().split("\n")[0]
    return msg[:300]


async def _locate(page, element: str):
    loc = page.locator(f'[data-label-id="{element}"]')
    if await loc.count() == 0:
        raise ActionError(f"element {element} is not on the page (use an id from the current observation)")
    return loc.first


async def _scroll(page, direction: int, height: int) -> None:
    dy = direction * round(height * 2 / 3)
    await page.evaluate(
        """(dy) => {
            const y0 = window.scrollY;
            window.scrollBy({top: dy, left: 0, behavior: 'instant'});
            if (window.scrollY !== y0) return;
            // the window cannot move: scroll the largest visible scrollable box instead
            let best = null, area = 0;
            for (const el of document.querySelectorAll('*')) {
                if (el.scrollHeight <= el.clientHeight + 1) continue;
                const oy = getComputedStyle(el).overflowY;
                if (oy !== 'auto' && oy !== 'scroll') continue;
                const r = el.getBoundingClientRect();
                const a = Math.max(0, Math.min(r.right, innerWidth) - Math.max(r.left, 0)) *
                          Math.max(0, Math.min(r.bottom, innerHeight) - Math.max(r.top, 0));
                if (a > area) { area = a; best = el; }
            }
            if (best) best.scrollBy({top: dy, left: 0, behavior: 'instant'});
        }""", dy)


async def _type(page, loc, text: str, replaces: bool, timeout: int) -> None:
    tag = await loc.evaluate("e => e.tagName.toLowerCase()")
    if tag == "select":
        raise ActionError('this element is a dropdown; use do(action="Select Dropdown Option", ...)')
    await loc.click(timeout=timeout)
    if replaces:
        await page.keyboard.press("ControlOrMeta+A")
    else:  # the official executor: Meta+A does not select on Linux, so this deletes one character
        await page.keyboard.press("Meta+A")
    await page.keyboard.press("Backspace")
    await page.keyboard.type(text)


async def _select(loc, wanted: str, timeout: int) -> None:
    info = await loc.evaluate(
        """e => { const s = e.tagName.toLowerCase() === 'select' ? e : e.querySelector('select');
                  return s ? Array.from(s.options).map(o => o.textContent.replace(/\\s+/g, ' ').trim()) : null; }""")
    if info is None:
        raise ActionError("element is not a dropdown (<select>)")
    low = wanted.strip().lower()
    for i, text in enumerate(info):
        if low in text.lower():
            target = loc if await loc.evaluate("e => e.tagName.toLowerCase() === 'select'") else loc.locator("select").first
            await target.select_option(index=i, timeout=timeout)
            return
    raise ActionError(f"no option contains {wanted!r}; options: {info[:20]}")


async def _press_enter(page, timeout: int) -> None:
    """Enter on the focused element through a locator, so a form submission's navigation is waited for."""
    focused = page.locator("*:focus")
    if await focused.count() == 1:
        await focused.press("Enter", timeout=timeout)
    else:
        await page.keyboard.press("Enter")


# Does a click on this element open a new tab: a link with a target other than this frame's, or a submit control
# whose formtarget / form target is one (a click in a text field of such a form submits nothing)?
_OPENS_TAB_JS = """e => { const link = e.closest('a[target], area[target]');
  const submits = e.form && (e.type === 'submit' || e.type === 'image');
  const t = (link ? link.getAttribute('target') : submits ? (e.getAttribute('formtarget') || e.form.target) : '') || '';
  return t !== '' && !['_self', '_parent', '_top'].includes(t.toLowerCase()); }"""


async def _click_opening_tab(page, loc, timeout: int, settle_timeout_ms: int) -> None:
    """Click and wait for the tab it opens: the context's page event arrives asynchronously, and on a loaded
    machine it came after the next observation (the env then stayed on the old tab). A tab that does not open
    within the settle time (a blocked popup) is not an error of the click."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    clicked = False
    try:
        async with page.context.expect_page(timeout=max(settle_timeout_ms, 1000)):
            await loc.click(timeout=timeout)
            clicked = True
    except PlaywrightTimeout:
        if not clicked:  # the click itself timed out
            raise


async def execute(page, action: Action, *, viewport_height: int, timeout_ms: int, type_replaces: bool = True,
                  settle_timeout_ms: int = 3000) -> None:
    """Run one parsed (non-exit) action on the page. Raises ``ActionError`` (or a Playwright error)."""
    name, t = action.name, timeout_ms
    if name in ("Click", "Right Click"):
        loc = await _locate(page, action.element)
        if name == "Click" and await loc.evaluate(_OPENS_TAB_JS):
            await _click_opening_tab(page, loc, t, settle_timeout_ms)
        else:
            await loc.click(timeout=t, button="right" if name == "Right Click" else "left")
    elif name in ("Type", "Search"):
        loc = await _locate(page, action.element)
        await _type(page, loc, action.argument or "", type_replaces, t)
        if name == "Search":  # a locator press waits for the navigation it starts (page.keyboard does not)
            await loc.press("Enter", timeout=t)
    elif name == "Hover":
        loc = await _locate(page, action.element)
        await loc.hover(timeout=t)
    elif name == "Scroll Up":
        await _scroll(page, -1, viewport_height)
    elif name == "Scroll Down":
        await _scroll(page, 1, viewport_height)
    elif name == "Press Enter":
        await _press_enter(page, t)
    elif name == "Select Dropdown Option":
        loc = await _locate(page, action.element)
        await _select(loc, action.argument or "", t)
    elif name == "Go backward":
        if await page.go_back(timeout=max(t, 10000)) is None:
            raise ActionError("there is no previous page")
    elif name == "Go forward":
        if await page.go_forward(timeout=max(t, 10000)) is None:
            raise ActionError("there is no next page")
    elif name == "Wait":
        try:
            await page.wait_for_load_state("networkidle", timeout=max(settle_timeout_ms, 1000))
        except Exception:  # still busy: the agent asked to wait, not to fail
            pass
    elif name == "Switch Tab":
        pass  # handled by WebEnv, which owns the tab list
    else:
        raise ActionError(f"cannot execute {name!r}")
